"""The detectors figure of one model: a layers x heads grid per detector (layer 1 at the top, head 1 at the
left), and the share of sink heads per layer on each input kind."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ..core.figures import save_figure  # noqa: E402
from ..core.io import flags, head_shape  # noqa: E402
from .registry import REGISTRY  # noqa: E402


def detector_figure(heads: pd.DataFrame, sinks: pd.DataFrame, model: str, png, svg) -> None:
    n_layers, n_heads = head_shape(heads)
    main = {d: r.main_input for d, r in REGISTRY.items()}
    dets = [d for d in main if ((heads["detector"] == d) & (heads["input"] == main[d])).any()]
    cell = 0.22 if n_layers > 12 else 0.35
    w = max(2.4, cell * n_heads + 1.2)
    fig, axes = plt.subplots(
        1,
        len(dets) + 1,
        figsize=(w * len(dets) + 4.0, max(3.2, cell * n_layers + 1.8)),
        squeeze=False,
        layout="constrained",
    )
    im, grouped = None, False
    for ax, det in zip(axes[0], dets):
        t = heads[(heads["detector"] == det) & (heads["input"] == main[det])].sort_values(["layer", "head"])
        grid = t["mean"].to_numpy(float).reshape(n_layers, n_heads)
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, origin="upper", aspect="equal")
        sig = flags(t["significant"]).reshape(n_layers, n_heads)
        yy, xx = np.nonzero(sig)
        ax.plot(xx, yy, ".", color="white", markersize=3)
        groups = t["kv_group"].to_numpy().reshape(n_layers, n_heads)[0]
        grouped = len(np.unique(groups)) < n_heads  # grouped-query attention: draw the group boundaries
        if grouped:
            for x in np.flatnonzero(np.diff(groups)) + 0.5:
                ax.axvline(x, color="red", linewidth=0.8)
        ax.set_title(REGISTRY[det].title, fontsize=8)
        ax.set_xticks(range(n_heads), [str(h + 1) for h in range(n_heads)], fontsize=6)
        step = 1 if n_layers <= 16 else 3
        ax.set_yticks(range(0, n_layers, step), [str(la + 1) for la in range(0, n_layers, step)], fontsize=6)
        ax.set_xlabel("head (1-based)", fontsize=7)
        ax.set_ylabel("layer (1-based)", fontsize=7)
    if im is not None:
        cb = fig.colorbar(im, ax=list(axes[0][: len(dets)]), location="bottom", fraction=0.04, shrink=0.6)
        cb.set_label("mean attention on the pattern (fraction of the row)", fontsize=7)
    ax = axes[0][-1]
    per = sinks[sinks["layer"].astype(str) != "all"].copy()
    per["layer"] = per["layer"].astype(int)
    for kind, m in per.groupby("input", sort=False):
        ax.plot(m["layer"] + 1, m["sink_head_share"], marker="o", markersize=3, label=kind)
    eps = float(sinks["epsilon"].iloc[0]) if len(sinks) else np.nan
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("layer (1-based)", fontsize=7)
    ax.set_ylabel(f"share of the layer's heads with alpha_1 > {eps:g}", fontsize=7)
    ax.set_title("sink heads per layer, by input", fontsize=8)
    ax.legend(fontsize=6)
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            color="white",
            markeredgecolor="black",
            markersize=4,
            linestyle="none",
            label="significant vs shuffled null (FDR)",
        ),
    ]
    if grouped:
        handles.append(Line2D([], [], color="red", linewidth=0.8, label="key/value group boundary"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(f"Head detectors of {model} ({n_layers} x {n_heads})", fontsize=10)
    save_figure(fig, png, svg)
