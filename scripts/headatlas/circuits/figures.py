"""The composition figure of one model: per mode (Q, K, V) the strongest composition edges (largest z against
random orientations) between labelled heads, drawn on the layers x heads grid (layer 1 at the left)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ..core.figures import head_label, save_figure  # noqa: E402
from ..core.io import flags, head_shape  # noqa: E402
from .weights import MODES  # noqa: E402

ROLE_COLOURS = {
    "previous-token": "#1f77b4",
    "duplicate": "#9467bd",
    "induction": "#d62728",
    "copying": "#2ca02c",
    "copy suppression": "#ff7f0e",
    "successor": "#8c564b",
    "": "#c7c7c7",
}
MODE_TITLES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}
STRONG = 0.3  # a detector label needs a significant mean score above this


def head_roles(heads: pd.DataFrame, detectors: pd.DataFrame | None) -> dict[tuple[int, int], str]:
    """(layer, head) -> a role label: the strongest significant detector among previous-token, duplicate and
    induction (mean > 0.3 on its main input), else copying / copy suppression / successor (significant, share
    > 0.5 / > 0.5 / > 0.2) from the weights; '' for the rest."""
    roles: dict = {}
    for _, r in heads.iterrows():
        key = (int(r["layer"]), int(r["head"]))
        for col, name, thr in (("circ_copying", "copying", 0.5), ("circ_neg_copying", "copy suppression", 0.5),
                               ("circ_successor", "successor", 0.2)):  # fmt: skip
            if col in r and flags(r.get(f"{col}_sig")) and r[col] > thr:
                roles[key] = name
    if detectors is not None and len(detectors):
        main = detectors[flags(detectors["main"])]
        main = main[flags(main["significant"]) & (main["mean"] > STRONG)]
        main = main[main["detector"].isin(["prev", "duplicate", "induction"])].sort_values("mean")
        names = {"prev": "previous-token", "duplicate": "duplicate", "induction": "induction"}
        for _, r in main.iterrows():  # ascending: the strongest detector of a head is written last
            roles[(int(r["layer"]), int(r["head"]))] = names[r["detector"]]
    return roles


def strongest_edges(pairs: pd.DataFrame, roles: dict, mode: str, n: int) -> pd.DataFrame:
    """The ``n`` pairs of largest z in ``mode`` with both heads labelled (topped up with unlabelled pairs)."""
    z = f"comp_{mode}_z"
    p = pairs.sort_values(z, ascending=False, kind="stable")
    lab = [(roles.get((a, b), "") != "") and (roles.get((c, d), "") != "")
           for a, b, c, d in zip(p["writer_layer"], p["writer_head"], p["reader_layer"], p["reader_head"])]  # fmt: skip
    lab = np.asarray(lab, dtype=bool)
    k = min(n, int(lab.sum()))
    return pd.concat([p[lab].head(k), p[~lab].head(n - k)])


def composition_figure(pairs: pd.DataFrame, heads: pd.DataFrame, detectors: pd.DataFrame | None, model: str,
                       n_edges: int, png, svg) -> None:  # fmt: skip
    n_layers, n_heads = head_shape(heads)
    roles = head_roles(heads, detectors)
    w, h = max(4.5, 0.32 * n_layers + 1.5), max(3.5, 0.32 * n_heads + 1.6)
    rows = 3 if n_layers > 12 else 1  # many layers: the panels one above the other
    fig, axes = plt.subplots(rows, 3 // rows, figsize=(w * 3 // rows, h * rows), squeeze=False, layout="constrained")
    for ax, mode in zip(axes.ravel(), MODES):
        ax.set_title(f"{model}: {MODE_TITLES[mode]}, top {n_edges} by z", fontsize=9)
        lay, hd = np.divmod(np.arange(n_layers * n_heads), n_heads)
        colours = [ROLE_COLOURS[roles.get((a, b), "")] for a, b in zip(lay, hd)]
        ax.scatter(lay + 1, hd + 1, s=14, c=colours, zorder=3, linewidths=0)
        if len(pairs):
            e = strongest_edges(pairs, roles, mode, n_edges)
            zs = e[f"comp_{mode}_z"].to_numpy(float)
            widths = 0.6 + 2.4 * (zs - zs.min()) / (np.ptp(zs) or 1.0)
            named = set()
            for (_, r), lw in zip(e.iterrows(), widths):
                a, b, c, d = (int(r[k]) for k in ("writer_layer", "writer_head", "reader_layer", "reader_head"))
                ax.plot([a + 1, c + 1], [b + 1, d + 1], color="0.25", lw=lw, alpha=0.55, zorder=2)
                named |= {(a, b), (c, d)}
            for a, b in sorted(named):
                ax.annotate(head_label(a, b), (a + 1, b + 1), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_xlabel("layer")
        ax.set_ylabel("head")
        ax.set_xlim(0.3, n_layers + 0.7)
        ax.set_ylim(n_heads + 0.7, 0.3)
    handles = [Line2D([], [], marker="o", ls="", color=c, label=r or "no label") for r, c in ROLE_COLOURS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    save_figure(fig, png, svg)
