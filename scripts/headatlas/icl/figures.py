"""One figure per model: the FV AIE of every head (layers x heads), with the induction score beside it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.figures import layer_head_axes, save_figure
from ..core.io import flags, head_shape


def grid(table: pd.DataFrame, value: str) -> np.ndarray:
    """A [layers, heads] array of ``value`` from a table with layer and head columns (NaN where absent)."""
    L, H = head_shape(table)
    g = np.full((L, H), np.nan)
    g[table["layer"].to_numpy(int), table["head"].to_numpy(int)] = table[value].to_numpy(float)
    return g


def induction_scores(detectors: pd.DataFrame | None) -> pd.DataFrame | None:
    """The detectors' main induction row per head (layer, head, mean), or None without one."""
    if detectors is None:
        return None
    d = detectors[(detectors["detector"] == "induction") & flags(detectors["main"])]
    return d[["layer", "head", "mean"]] if len(d) else None


def fv_figure(heads: pd.DataFrame, detectors: pd.DataFrame | None, model: str, png, svg) -> None:
    """Left: AIE per head (diverging colours around 0; a ring on the top-k heads, a dot where the CI clears the
    null; hatched grey: no value, e.g. an unreliable estimate). Right: the induction score, where measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ind = induction_scores(detectors)
    L, H = head_shape(heads)
    w = min(5.0, 1.2 + 0.35 * H)
    fig, axes = plt.subplots(1, 2, figsize=(2 * w + 1, min(9.0, 1.5 + 0.22 * L)), squeeze=False)
    ax = axes[0][0]
    aie = grid(heads, "aie")
    if np.isfinite(aie).any():
        m = max(float(np.nanmax(np.abs(aie))), 1e-9)
        im = ax.imshow(aie, cmap="RdBu_r", vmin=-m, vmax=m, aspect="auto")
        fig.colorbar(im, ax=ax, label="AIE (change in p(target), 0-1)")
        top = heads[flags(heads["top"])]
        ax.scatter(top["head"], top["layer"], s=60, facecolors="none", edgecolors="k", linewidths=1, label="top-k")
        sig = heads[flags(heads["above_null"])]
        ax.scatter(sig["head"], sig["layer"], s=6, c="k", label="CI above the null")
        ax.legend(fontsize=6, loc="lower right")
        kinds = heads["kind"].value_counts().to_dict()
        ax.set_title(f"{model}: FV average indirect effect\n({', '.join(f'{k}: {v}' for k, v in kinds.items())})",
                     fontsize=8)  # fmt: skip
    else:
        reason = str(heads["kind"].iloc[0]) if len(heads) else "no heads"
        ax.text(0.5, 0.5, f"{model}: no AIE\n{reason}", ha="center", va="center", wrap=True, fontsize=8,
                transform=ax.transAxes)  # fmt: skip
        ax.set_title(f"{model}: FV average indirect effect (skipped)", fontsize=8)
    layer_head_axes(ax, L, H)
    ax = axes[0][1]
    if ind is not None:
        im = ax.imshow(grid(ind, "mean"), cmap="viridis", vmin=0, aspect="auto")
        fig.colorbar(im, ax=ax, label="induction score (fraction of attention)")
        ax.set_title(f"{model}: induction score (detectors, repeated random tokens)", fontsize=8)
    else:
        ax.text(0.5, 0.5, "induction scores not measured\n(analysis.detectors does not cover this model)",
                ha="center", va="center", fontsize=8, transform=ax.transAxes)  # fmt: skip
        ax.set_title(f"{model}: induction score (not measured)", fontsize=8)
    layer_head_axes(ax, L, H)
    fig.tight_layout()
    save_figure(fig, png, svg)
