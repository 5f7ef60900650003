"""The quiet-heads figure of one model: four layers x heads grids (positional share, mean largest weight, relative
output norm, entropy variance over sequences; layer 1 at the top, head 1 at the left) and, per layer, the residual
stream's largest and median |activation| with the share of sequences holding a massive activation at the first
token."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.figures import layer_head_axes, save_figure  # noqa: E402
from ..core.io import flags, head_shape  # noqa: E402

# column, title, colour map, colour bar label, the flag column marked with dots (or None)
GRIDS = (
    ("quiet_positional", "positional: share of rows with the maximum at -1 or +1", "viridis", "share of rows",
     "quiet_positional_head"),
    ("quiet_max_weight", "mean largest weight of a row", "magma", "fraction of the row", "quiet_sink_after_massive"),
    ("quiet_norm_rel", "output norm / layer mean", "cividis", "ratio", "quiet_zero_null"),
    ("quiet_entropy_var", "variance of the mean entropy over sequences", "plasma", "nats squared", None),
)  # fmt: skip
MARKS = {
    "quiet_positional_head": "positional head",
    "quiet_sink_after_massive": "sink head after a massive activation",
    "quiet_zero_null": "zero-ablation CI holds 0",
}


def quiet_figure(heads: pd.DataFrame, layers: pd.DataFrame, model: str, png, svg) -> None:
    n_layers, n_heads = head_shape(heads)
    h = heads.sort_values(["layer", "head"])
    cell = 0.2 if n_layers > 12 else 0.3
    w = max(2.0, cell * n_heads + 1.3)
    fig, axes = plt.subplots(
        1, len(GRIDS) + 1, figsize=(min(11.0, w * len(GRIDS) + 3.2), max(3.4, cell * n_layers + 2.2)),
        squeeze=False, layout="constrained", width_ratios=[1] * len(GRIDS) + [1.6],
    )  # fmt: skip
    for ax, (col, title, cmap, label, flag) in zip(axes[0], GRIDS):
        grid = h[col].to_numpy(float).reshape(n_layers, n_heads)
        vmax = 1.0 if col in ("quiet_positional", "quiet_max_weight") else None
        im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=vmax, origin="upper", aspect="auto")
        if flag is not None and flag in h:
            yy, xx = np.nonzero(flags(h[flag]).reshape(n_layers, n_heads))
            ax.plot(xx, yy, ".", color="white", markeredgecolor="black", markeredgewidth=0.3, markersize=4)
        layer_head_axes(ax, n_layers, n_heads, fontsize=5)
        ax.set_title(title, fontsize=6)
        cb = fig.colorbar(im, ax=ax, location="bottom", fraction=0.05, pad=0.02)
        cb.set_label(label + (f"; dots: {MARKS[flag]}" if flag else ""), fontsize=5)
        cb.ax.tick_params(labelsize=5)
    ax = axes[0][-1]
    x = layers["layer"].to_numpy() + 1
    ax.semilogy(x, layers["top_abs"], marker="o", markersize=2, label="largest |x|")
    ax.semilogy(x, layers["median_abs"], marker="o", markersize=2, label="median |x|")
    if len(layers):
        thr = float(layers["threshold"].iloc[0])
        ax.axhline(thr, color="grey", linewidth=0.6, linestyle="--", label=f"|x| = {thr:g}")
    ax.set_xlabel("layer whose input it is (1-based)", fontsize=6)
    ax.set_ylabel("|activation| of the residual stream (mean over sequences)", fontsize=6)
    ax.tick_params(labelsize=5)
    twin = ax.twinx()
    twin.bar(x, layers["massive_first_share"], color="red", alpha=0.25, label="massive at the first token")
    twin.set_ylim(0, 1.02)
    twin.set_ylabel("share of sequences with a massive activation at the first token", fontsize=5)
    twin.tick_params(labelsize=5)
    lines = ax.get_legend_handles_labels()
    bars = twin.get_legend_handles_labels()
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], fontsize=5, loc="upper left")
    ax.set_title("massive activations by layer (Sun et al.)", fontsize=6)
    fig.suptitle(
        f"Positional, dormant and rigid heads, and massive activations: {model} ({n_layers} x {n_heads})", fontsize=8
    )
    save_figure(fig, png, svg)
