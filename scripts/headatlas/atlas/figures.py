"""Figures of the head atlas: the per-model grid, method agreement, cross-model profiles."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..core.figures import layer_head_axes, save_figure  # noqa: E402
from ..core.io import flags  # noqa: E402
from .analysis import DETECTORS, JM_CATEGORIES, PANDE_ROLES_MAIN  # noqa: E402

BEHAVIOUR_COLOURS = {
    "broad": "#9ecae1",
    "next": "#fdae6b",
    "prev": "#fd8d3c",
    "cls": "#a1d99b",
    "bos": "#a1d99b",
    "sep": "#c994c7",
    "punct": "#fee391",
}


def legend_behaviours(behaviours) -> list[str]:
    """Clark labels for the legend: a decoder's BOS plays [CLS]'s part and shares its
    colour, so only the one the model has is listed."""
    drop = "cls" if "bos" in set(behaviours) else "bos"
    return [k for k in BEHAVIOUR_COLOURS if k != drop]


# Pande's main roles drawn as markers at fixed spots of a cell (marker, (dx, dy) from the centre, colour), one
# spot per main role in order (a main role without a spot fails here)
ROLE_MARKERS = dict(
    zip(
        PANDE_ROLES_MAIN,
        [
            ("<", (-0.25, -0.22), "#08519c"),
            ("^", (0.25, -0.22), "#a50f15"),
            ("s", (-0.25, 0.22), "#54278f"),
            ("o", (0.25, 0.22), "#006d2c"),
        ],
        strict=True,
    )
)


def stability_alpha(share) -> float:
    """Marker opacity for a label that holds in ``share`` of the corpora tested (the length-robust
    stability; the bootstrap share is near 1 for almost every label): 1 when it always holds (or no
    stability is known), fading to 0.2 when it never does."""
    try:
        share = float(share)
    except (TypeError, ValueError):
        return 1.0
    return 1.0 if not np.isfinite(share) else float(0.2 + 0.8 * np.clip(share, 0.0, 1.0))


def _fmt(v, spec: str = ".2f") -> str:
    """A number for a figure title; 'n/a' for NaN or None."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "n/a"
    return format(v, spec) if np.isfinite(v) else "n/a"


def atlas_grid(atlas: pd.DataFrame, n_layers: int, n_heads: int, model: str, png, svg) -> None:
    """Layers x heads grid: fill = Clark behaviour, markers = Pande roles (FDR), a black frame =
    the head's best relation beats that relation's offset baseline by 5+ points, and the cell text =
    the Jo & Myaeng category (S surface, Y syntactic, M semantic) the head probes best relative to
    the model's other heads. When the atlas has detector columns, a second panel
    (:func:`detector_panel`) shows them. Layer 1 is at the top, head 1 at the left (:func:`_grid_axes`)."""
    cell = 0.42
    detectors = any(c.startswith("det_") for c in atlas.columns) or ablation_column(atlas) is not None
    fig_w = max(6.0, cell * n_heads + 3.2)
    fig_h = max(4.0, cell * n_layers + 1.6)
    if detectors:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(2 * fig_w + 1.0, fig_h), layout="constrained")
    else:
        fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    a = atlas.set_index(["layer", "head"])
    cats = [c for c in ("surface", "syntactic", "semantic") if f"probe_{c}_mean_acc" in atlas]
    if cats:
        z = pd.DataFrame(
            {
                c: (atlas[f"probe_{c}_mean_acc"] - atlas[f"probe_{c}_mean_acc"].mean())
                / (atlas[f"probe_{c}_mean_acc"].std() or 1)
                for c in cats
            }
        )
        best_cat = pd.Series(np.array(cats)[np.nanargmax(z.fillna(-np.inf).to_numpy(), axis=1)], index=a.index)
    for (layer, head), row in a.iterrows():
        colour = (
            BEHAVIOUR_COLOURS.get(row.get("clark_behaviour"), "white")
            if isinstance(row.get("clark_behaviour"), str)
            else "white"
        )
        framed = (
            bool(row.get("syntax_best_margin", 0) >= 0.05) if pd.notna(row.get("syntax_best_margin", np.nan)) else False
        )
        ax.add_patch(
            plt.Rectangle(
                (head - 0.5, layer - 0.5),
                1,
                1,
                facecolor=colour,
                edgecolor="black" if framed else "#cccccc",
                linewidth=2.0 if framed else 0.5,
            )
        )
        for role, (marker, (dx, dy), mc) in ROLE_MARKERS.items():
            if bool(row.get(f"pande_{role}_sig_fdr", False)):
                ax.plot(
                    head + dx,
                    layer + dy,
                    marker=marker,
                    color=mc,
                    markersize=4.5,
                    linestyle="none",
                    alpha=stability_alpha(row.get(f"pande_{role}_corpus_share_fdr")),
                )
        if cats:
            ax.text(
                head,
                layer,
                {"surface": "S", "syntactic": "Y", "semantic": "M"}[best_cat[(layer, head)]],
                ha="center",
                va="center",
                fontsize=6.5,
                color="#333333",
            )
    _grid_axes(ax, n_layers, n_heads)
    ax.set_title(f"Head atlas of {model} ({n_layers} x {n_heads})", fontsize=10)
    shown = legend_behaviours(atlas.get("clark_behaviour", []))
    handles = [Patch(facecolor=BEHAVIOUR_COLOURS[k], edgecolor="#999999", label=f"Clark: {k}") for k in shown]
    handles += [
        Line2D([], [], marker=m, color=c, linestyle="none", label=f"Pande: {r} (FDR)")
        for r, (m, _, c) in ROLE_MARKERS.items()
    ]
    if any(f"pande_{r}_corpus_share_fdr" in atlas for r in ROLE_MARKERS):
        handles += [Line2D([], [], marker="s", color="#54278f", linestyle="none", alpha=stability_alpha(v), label=f"Pande opacity: label holds on {v:.0%} of corpora")
                    for v in (1.0, 0.5, 0.0)]  # fmt: skip
    handles += [
        Patch(facecolor="white", edgecolor="black", linewidth=2, label="Clark: best relation > offset baseline + 5 pts")
    ]
    if cats:
        handles += [Patch(facecolor="white", edgecolor="white", label="text: best J&M category (S/Y/M)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    if detectors:
        detector_panel(ax2, atlas, n_layers, n_heads)
    save_figure(fig, png, svg)


def _grid_axes(ax, n_layers: int, n_heads: int) -> None:
    """The convention's orientation (:func:`~headatlas.core.figures.layer_head_axes`), square cells."""
    layer_head_axes(ax, n_layers, n_heads, fontsize=8)
    ax.set_aspect("equal")


# detectors drawn in the second panel: fill colour of the strongest significant one
DETECTOR_COLOURS = {"induction": "#d62728", "duplicate": "#ff7f0e", "prev": "#1f77b4"}


def ablation_column(atlas: pd.DataFrame) -> str | None:
    """The ablation-effect column drawn in the atlas figure (``ablation_<task>_<metric>_effect``):
    the first one with a value, else the first one; None without any."""
    cols = [c for c in atlas.columns if c.startswith("ablation_") and c.endswith("_effect")]
    return next((c for c in cols if atlas[c].notna().any()), cols[0] if cols else None)


def ablation_text(value, kind) -> tuple[str, bool]:
    """The cell text of an ablation value and whether it is an estimate (drawn hatched):
    exact -> '0.12', 'estimated (checked)' -> '~0.12'; unreliable -> '?' and skipped -> '' (no
    effect shown). A value without a kind (an older atlas) is shown as it is."""
    kind = "exact" if kind is None or (isinstance(kind, float) and np.isnan(kind)) else str(kind)
    if kind == "unreliable":
        return "?", False
    if kind.startswith("skipped") or value is None or not np.isfinite(float(value)):
        return "", False
    estimated = kind == "estimated (checked)"
    return ("~" if estimated else "") + f"{float(value):.2f}", estimated


def ablation_unit(column: str) -> str:
    return "accuracy, a share (x 100 = points)" if column.endswith("_accuracy_effect") else "nats"


def detector_panel(ax, atlas: pd.DataFrame, n_layers: int, n_heads: int) -> None:
    """Second atlas panel: fill = the significant (FDR) detector with the highest mean score among induction,
    duplicate-token and previous-token, its opacity the score; a black dot = sink head (mean attention to the
    first token above epsilon); thick lines = key/value group boundaries (grouped-query attention); the cell
    text = the ablation effect when the atlas has one."""
    dets = [d for d in DETECTOR_COLOURS if f"det_{d}" in atlas]
    abl = ablation_column(atlas)
    for row in atlas.itertuples(index=False):
        r = row._asdict()
        layer, head = int(r["layer"]), int(r["head"])
        sig = [(float(r[f"det_{d}"]), d) for d in dets if flags(r.get(f"det_{d}_sig"))]
        colour, alpha = "white", 1.0
        if sig:
            score, best = max(sig)
            colour, alpha = DETECTOR_COLOURS[best], float(0.25 + 0.75 * np.clip(score, 0, 1))
        ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, facecolor=colour, alpha=alpha, edgecolor="none"))
        ax.add_patch(
            plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, facecolor="none", edgecolor="#cccccc", linewidth=0.5)
        )
        if flags(r.get("det_sink_head")):
            ax.plot(head + 0.3, layer + 0.3, "o", color="black", markersize=2.5)
        if abl is not None:
            text, estimated = ablation_text(r.get(abl), r.get(f"{abl}_kind"))
            if estimated:
                ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, hatch="////",
                                           edgecolor="#999999", linewidth=0))  # fmt: skip
            if text:
                colour = "#999999" if text == "?" else "#333333"
                ax.text(head, layer, text, ha="center", va="center", fontsize=5, color=colour)
    grouped = False
    if "det_kv_group" in atlas:
        groups = atlas.sort_values(["layer", "head"])["det_kv_group"].to_numpy()[:n_heads]
        grouped = len(np.unique(groups)) < n_heads  # grouped-query attention
        for x in np.flatnonzero(np.diff(groups)) + 0.5 if grouped else []:
            ax.axvline(x, color="black", linewidth=1.5)
    _grid_axes(ax, n_layers, n_heads)
    title = "Detectors: strongest significant pattern (FDR), sink heads, KV groups" if dets else "Ablation effects"
    ax.set_title(title, fontsize=9)
    handles = [Patch(facecolor=c, label=f"{d} (opacity: mean score)") for d, c in DETECTOR_COLOURS.items() if d in dets]
    handles += [
        Line2D([], [], marker="o", color="black", linestyle="none", markersize=3, label="sink head (alpha_1 > epsilon)")
    ]
    if grouped:
        handles += [Line2D([], [], color="black", linewidth=1.5, label="key/value group boundary")]
    if abl is not None:
        kinds = set(atlas.get(f"{abl}_kind", pd.Series(["exact"])).astype(str))
        handles += [Patch(facecolor="white", edgecolor="white", label=f"text: {abl} ({ablation_unit(abl)})")]
        if "estimated (checked)" in kinds:
            handles += [Patch(facecolor="white", edgecolor="#999999", hatch="////",
                              label="hatched, ~: estimate (layer passed the exact check)")]  # fmt: skip
        if "unreliable" in kinds:
            handles += [Patch(facecolor="white", edgecolor="white", label="?: unreliable estimate (no effect shown)")]
        skipped = sorted(k for k in kinds if k.startswith("skipped"))
        if skipped:
            handles += [Patch(facecolor="white", edgecolor="white", label=textwrap.fill(f"blank: {skipped[0]}", 60))]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def agreement_figure(scores: pd.DataFrame, agreement: pd.DataFrame, model: str, png, svg) -> None:
    """Scatter of each pair of the three syntactic scores across heads, with Spearman rho and CI."""
    pairs = [
        (r.method_a, r.method_b, r)
        for r in agreement.itertuples()
        if r.method_a in ("clark_syntax", "pande_syntactic", "jm_syntactic")
        and r.method_b in ("clark_syntax", "pande_syntactic", "jm_syntactic")
    ]
    rel = agreement[~agreement["method_a"].isin(["clark_syntax", "pande_syntactic", "jm_syntactic"])]
    n = max(1, len(pairs)) + (1 if len(rel) else 0)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    names = {
        "clark_syntax": "Clark: argmax accuracy (All)",
        "pande_syntactic": "Pande: syntactic effect (score / tau)",
        "jm_syntactic": "Jo & Myaeng: syntactic probe acc.",
    }
    for ax, (a, b, r) in zip(axes[0], pairs):
        ax.scatter(scores[a], scores[b], c=scores["layer"], cmap="viridis", s=14)
        ax.set_xlabel(names[a], fontsize=8)
        ax.set_ylabel(names[b], fontsize=8)
        ax.set_title(
            f"rho = {_fmt(r.spearman)} [{_fmt(r.ci_low)}, {_fmt(r.ci_high)}] (n = {r.n_heads})\ntop-{r.top_k} overlap {r.top_k_overlap} (chance {_fmt(r.top_k_chance, '.1f')})",
            fontsize=8,
        )
    if not pairs:
        axes[0][0].text(0.5, 0.5, "fewer than two methods available", ha="center", va="center")
        axes[0][0].set_axis_off()
    if len(rel):
        ax = axes[0][-1]
        y = np.arange(len(rel))
        # the CI as a line from its ends (a percentile interval need not contain the estimate: no error-bar lengths)
        lo, hi, rho = (rel[c].to_numpy(dtype=float) for c in ("ci_low", "ci_high", "spearman"))
        ax.hlines(y, lo, hi, color="#a50f15", linewidth=1.5)
        ax.plot(rho, y, "o", color="#a50f15")
        for yy, v in zip(y, rho):
            if not np.isfinite(v):
                ax.text(
                    0, yy, "n/a (too few heads or no spread)", fontsize=7, va="center", ha="center", color="#666666"
                )
        ax.set_yticks(y, [a.replace("clark_", "") for a in rel["method_a"]], fontsize=8)
        ax.set_ylim(-0.5, len(rel) - 0.5)
        ax.axvline(0, color="#999999", linewidth=0.8)
        ax.set_xlim(-1.05, 1.05)
        ax.set_xlabel("Spearman rho, Clark accuracy vs Pande effect", fontsize=8)
        ax.set_title("per relation (line: 95% percentile bootstrap CI)", fontsize=8)
    fig.suptitle(f"{model}: do the methods pick the same syntactic heads? (colour = layer)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, png, svg)


def cross_model_figure(
    profiles: dict[str, pd.DataFrame], columns: list[tuple[str, str]], title: str, ylabel: str, png, svg
) -> None:
    """One panel per column, one line per model, x = relative depth."""
    cols = [(c, t) for c, t in columns if any(c in p for p in profiles.values())]
    if not cols:
        fig, ax = plt.subplots(figsize=(5, 2))
        ax.text(0.5, 0.5, f"{title}: no model has this analysis", ha="center", va="center")
        ax.set_axis_off()
        save_figure(fig, png, svg)
        return
    ncol = min(4, len(cols))
    nrow = int(np.ceil(len(cols) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 2.8 * nrow), squeeze=False, sharex=True)
    for ax, (c, t) in zip(axes.flat, cols):
        for model, p in profiles.items():
            if c in p:
                ax.plot(p["relative_depth"], p[c], marker="o", markersize=3, label=model)
        ax.set_title(t, fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_xlabel("relative depth (layer centre / layers)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in list(axes.flat)[len(cols) :]:
        ax.set_axis_off()
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, png, svg)


def cross_model_figures(profiles: dict[str, pd.DataFrame], paths: dict[str, str]) -> None:
    """Rule atlas_cross_model: one figure per family (pande, clark, probing, detectors) of every model's layer profile,
    written to ``paths[family]`` (PNG) and ``paths[family + "_svg"]``."""
    behaviours = sorted({c for p in profiles.values() for c in p.columns if c.startswith("share_behaviour_")})
    share = "share of the layer's heads"
    figures = {
        "pande": (
            [(f"share_{r}", f"{r} (FDR)") for r in PANDE_ROLES_MAIN],
            "Pande roles: share of heads per layer",
            share,
        ),
        "clark": (
            [(c, c.replace("share_behaviour_", "Clark: ")) for c in behaviours],
            "Clark behaviour labels: share of heads per layer",
            share,
        ),
        "probing": (
            [(f"probe_{c}", f"{c} tasks") for c in JM_CATEGORIES],
            "Jo & Myaeng probing: mean head accuracy per layer",
            "mean test accuracy",
        ),
        "detectors": (
            [(f"share_det_{d.name}", d.title) for d in DETECTORS.values()]
            + [("share_retrieval", "retrieval heads (score > 0.1, long inputs)")],
            "Detectors: share of heads per layer significant (retrieval: Wu et al.'s score above 0.1)",
            share,
        ),
    }
    for family, (columns, title, ylabel) in figures.items():
        cross_model_figure(profiles, columns, title, ylabel, paths[family], paths[f"{family}_svg"])
