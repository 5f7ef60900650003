"""Figures of Jo & Myaeng (2020) for one model, from the tables of :mod:`headatlas.jomyaeng.analysis`.

Layers and heads are labelled 1-based on every axis (layer 1 = the first transformer layer); in
layers x heads panels layer 1 is at the top and head 1 at the left (core.figures.layer_head_axes).
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib

from ..core.io import head_shape, layer_count

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.cluster.hierarchy import dendrogram, leaves_list, linkage  # noqa: E402

from ..core.figures import layer_head_axes, layer_ticks, panel_columns, save_figure  # noqa: E402
from .analysis import CATEGORIES, category_scores, task_correlation  # noqa: E402


def head_matrix(heads: pd.DataFrame, task: str, value: str = "test_acc") -> np.ndarray:
    """[layers, heads] matrix of one task's per-head values."""
    g = heads[heads["task"] == task]
    L, H = head_shape(heads)
    m = np.full((L, H), np.nan)
    m[g["layer"].to_numpy(int), g["head"].to_numpy(int)] = g[value].to_numpy(float)
    return m


def sort_rows(m: np.ndarray) -> np.ndarray:
    """Each layer's heads sorted best first (NaN last), as in the paper's Fig. 2."""
    return -np.sort(-np.nan_to_num(m, nan=-np.inf), axis=1)


def _grid(n: int, ncols: int = 5):
    ncols = min(ncols, n)
    return math.ceil(n / ncols), ncols


def heatmaps(
    heads: pd.DataFrame, tasks: Sequence[str], path, svg, model: str, sort: bool = True, value: str = "test_acc"
) -> None:
    """One panel per task: layers (layer 1 at the top) x heads, colour = the value."""
    tasks = [t for t in tasks if t in set(heads["task"])]
    L, H = head_shape(heads)
    nrows, ncols = _grid(len(tasks), panel_columns(len(tasks), 3.1))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols, (1.2 + 0.12 * L) * nrows + 0.8), squeeze=False)
    diverging = value == "selectivity"
    for ax, task in zip(axes.flat, tasks):
        m = head_matrix(heads, task, value)
        if sort:
            m = sort_rows(m)
        metric = heads.loc[heads["task"] == task, "metric"].iloc[0]
        if diverging:
            lim = max(np.nanmax(np.abs(m)), 1e-6)
            im = ax.imshow(m, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
        else:
            im = ax.imshow(m, aspect="auto", cmap="plasma", interpolation="nearest")
        ax.set_title(f"{task} ({'selectivity' if diverging else metric})", fontsize=9)
        layer_head_axes(ax, L, H, "head rank in the layer (1 = best)" if sort else "head")
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    what = {
        "test_acc": "test accuracy (Pearson r for relatedness)",
        "selectivity": "selectivity = task - control test accuracy",
    }[value]
    order = "heads sorted within each layer by accuracy" if sort else "heads in model order"
    fig.suptitle(f"{model}: per-head probing {what}; {order}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    save_figure(fig, path, svg)


def correlation_clustermap(heads: pd.DataFrame, path, svg, model: str) -> None:
    """Task x task Pearson correlation of per-head test accuracies, clustered (average linkage)."""
    corr = task_correlation(heads).fillna(0.0)
    names = list(corr.columns)
    c = corr.to_numpy()
    if len(names) > 2:
        z = linkage(c, method="average", metric="euclidean")
        order = leaves_list(z)
    else:
        z, order = None, np.arange(len(names))
    fig = plt.figure(figsize=(2 + 0.55 * len(names), 1.6 + 0.5 * len(names)))
    ax_d = fig.add_axes((0.25, 0.80, 0.60, 0.15))
    ax_h = fig.add_axes((0.25, 0.10, 0.60, 0.68))
    ax_c = fig.add_axes((0.87, 0.10, 0.025, 0.68))
    if z is not None:
        dendrogram(z, ax=ax_d, no_labels=True, color_threshold=0, above_threshold_color="0.3")
        ax_d.set_xlim(0, 10 * len(names))  # leaf k sits at 10 k + 5, over heat-map column k
    ax_d.axis("off")
    m = c[np.ix_(order, order)]
    im = ax_h.imshow(m, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest", aspect="auto")
    ax_h.set_xticks(range(len(names)), [names[i] for i in order], rotation=60, ha="right", fontsize=8)
    ax_h.set_yticks(range(len(names)), [names[i] for i in order], fontsize=8)
    for i in range(len(names)):
        for j in range(len(names)):
            ax_h.text(
                j,
                i,
                f"{m[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if abs(m[i, j]) > 0.6 else "black",
            )
    fig.colorbar(im, cax=ax_c, label="Pearson r over heads")
    ax_d.set_title(f"{model}: tasks clustered by the correlation of their per-head accuracies", fontsize=10)
    save_figure(fig, path, svg)


def category_scatter(heads: pd.DataFrame, path, svg, model: str) -> None:
    """Per head: surface vs syntactic vs semantic score (mean test accuracy), coloured by layer."""
    cats = category_scores(heads)
    pairs = [
        (a, b)
        for a, b in (("surface", "syntactic"), ("surface", "semantic"), ("syntactic", "semantic"))
        if a in cats and b in cats
    ]
    if not pairs:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "no probing task of two categories", ha="center")
        ax.axis("off")
        save_figure(fig, path, svg)
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.3 * len(pairs) + 0.8, 4), squeeze=False)
    L = layer_count(cats)
    for ax, (a, b) in zip(axes.flat, pairs):
        sc = ax.scatter(
            cats[a],
            cats[b],
            c=cats["layer"] + 1,
            cmap="viridis",
            vmin=1,
            vmax=max(L, 2),
            s=14,
            alpha=0.85,
            edgecolors="none",
        )
        ax.set_xlabel(f"{a} score (mean test accuracy)", fontsize=8)
        ax.set_ylabel(f"{b} score (mean test accuracy)", fontsize=8)
        ax.set_title(f"{a} vs {b}", fontsize=9)
    fig.colorbar(sc, ax=axes.ravel().tolist(), label="layer (1-based; 1 = first)")
    fig.suptitle(f"{model}: each head's surface / syntactic / semantic score", fontsize=11)
    legend = "; ".join(
        f"{c} = {', '.join(t for t in CATEGORIES[c] if t in set(heads['task']))}" for c in CATEGORIES if c in cats
    )
    fig.text(0.01, -0.04, legend, fontsize=7)
    save_figure(fig, path, svg)


def focused_curve(heads: pd.DataFrame, path, svg, model: str, groups: dict[str, Sequence[str]]) -> None:
    """Accuracy against head percentile (heads sorted best first), one line per task: a steep
    drop means the information is focused in a few heads, a flat line that it is distributed."""
    groups = {k: [t for t in v if t in set(heads["task"])] for k, v in groups.items()}
    groups = {k: v for k, v in groups.items() if v}
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4), squeeze=False)
    for ax, (name, tasks) in zip(axes.flat, groups.items()):
        for task in tasks:
            v = np.sort(heads.loc[heads["task"] == task, "test_acc"].to_numpy())[::-1]
            x = 100 * np.arange(len(v)) / max(len(v) - 1, 1)
            ax.plot(x, v, label=task, lw=1.4)
        ax.set_xlabel("head percentile (0 = best head of the task)")
        ax.set_ylabel("test accuracy (Pearson r for relatedness)")
        ax.set_title(f"{name} tasks", fontsize=10)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{model}: is task information focused in a few heads or distributed?", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    save_figure(fig, path, svg)


def topn_curves(
    topn: pd.DataFrame, layers: pd.DataFrame, summary: pd.DataFrame, path, svg, model: str, tasks: Sequence[str]
) -> None:
    """Test accuracy of the top-n heads probe against n, with the last- and best-layer probes."""
    tasks = [t for t in tasks if t in set(topn["task"])]
    nrows, ncols = _grid(len(tasks))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.6 * nrows + 0.6), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        t = topn[topn["task"] == task].sort_values("n")
        s = summary[summary["task"] == task].iloc[0]
        ax.plot(t["n"], t["test"], "o-", ms=3, color="C0", label="top-n heads")
        ax.axhline(s["last_layer"], color="C3", ls="--", lw=1, label="last layer")
        ax.axhline(s["best_layer"], color="C2", ls=":", lw=1.3, label="best layer (chosen on dev)")
        ax.axhline(
            s["best_layer_by_test"], color="C1", ls="-.", lw=0.9, label="best layer (on test: the paper's choice)"
        )
        ax.axvline(s["n_top"], color="0.6", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("n heads concatenated (log)", fontsize=8)
        ax.set_ylabel("test " + ("r" if s["metric"] == "pearson" else "accuracy"), fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=6)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    fig.suptitle(f"{model}: effect of the number n of top heads (grey line: n = heads per layer)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    save_figure(fig, path, svg)


def layer_profile(heads: pd.DataFrame, layers: pd.DataFrame, path, svg, model: str, tasks: Sequence[str]) -> None:
    """Where each task's information sits: per layer, the best head's test accuracy scaled to
    0..1 within the task (left) and the layer probe's (right); a dot marks the maximum."""
    tasks = [t for t in tasks if t in set(heads["task"])]
    L = layer_count(heads)
    fig, axes = plt.subplots(
        1, 2, figsize=(2 * (2.5 + 0.22 * L) + 2.5, 1 + 0.36 * len(tasks)), squeeze=False, sharey=True
    )
    for ax, (name, frame, col) in zip(
        axes.flat,
        (
            ("best head in the layer", heads, "test_acc"),
            ("layer hidden state", layers.rename(columns={"test": "v"}), "v"),
        ),
    ):
        m = np.full((len(tasks), L), np.nan)
        for i, task in enumerate(tasks):
            v = frame[frame["task"] == task].groupby("layer")[col].max().reindex(range(L)).to_numpy(float)
            lo, hi = np.nanmin(v), np.nanmax(v)
            m[i] = (v - lo) / (hi - lo) if hi > lo else 0.0
        im = ax.imshow(m, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest")
        ax.scatter(np.nanargmax(m, axis=1), range(len(tasks)), c="cyan", s=12, marker="o")
        ax.set_yticks(range(len(tasks)), tasks, fontsize=8)
        ax.tick_params(axis="y", labelleft=ax is axes.flat[0])
        ax.set_xticks(*layer_ticks(L))
        ax.set_xlabel("layer (1-based; 1 = first)")
        ax.set_title(name, fontsize=10)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="test accuracy, min-max scaled per task")
    fig.suptitle(
        f"{model}: layer profile of each task (paper: surface low, word order middle, semantics high)", fontsize=10
    )
    save_figure(fig, path, svg)


def all_figures(
    heads, layers, topn, summary, out: dict, model: str, probing: Sequence[str], downstream: Sequence[str]
) -> None:
    """Rule jomyaeng_figures: each figure ``f`` as ``out[f]`` (PNG) and ``out[f + "_svg"]``."""
    tasks = list(probing) + list(downstream)

    def both(f):
        return out[f], out[f + "_svg"]

    heatmaps(heads, tasks, *both("heatmap_sorted"), model, sort=True)
    heatmaps(heads, tasks, *both("heatmap_unsorted"), model, sort=False)
    selective = heads[heads["task"].isin(probing)]
    heatmaps(selective, probing, *both("heatmap_selectivity"), model, sort=False, value="selectivity")
    correlation_clustermap(heads, *both("task_correlation"), model)
    category_scatter(heads, *both("categories"), model)
    focused_curve(heads, *both("focused"), model, {"probing": probing, "downstream": downstream})
    topn_curves(topn, layers, summary, *both("topn_curve"), model, tasks)
    layer_profile(heads, layers, *both("layer_profile"), model, tasks)
