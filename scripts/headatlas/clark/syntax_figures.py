"""Figures for Clark et al.'s Tables 1-3 and Fig. 5 (example heads), from the tidy tables.

Every figure states the model, the data and what the paper reported; heads are printed with
the paper's 1-based "layer-head" labels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import matplotlib

from ..core.io import head_shape

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.data import SPECIAL_NAMES, Record  # noqa: E402
from ..core.figures import head_label, layer_head_axes, panel_columns  # noqa: E402
from ..core.store import AttentionStore  # noqa: E402
from .coref import Anaphors, attention_correct, document_anaphors  # noqa: E402
from .syntax import DIRECTIONS, WordMaps, head_predictions, word_block, word_level  # noqa: E402

log = logging.getLogger("headatlas.clark.syntax_figures")


def plot_table1(t: pd.DataFrame, model: str, corpus: str):
    """Best head vs best offset baseline per Table 1 relation, paper's numbers as markers."""
    t = t[t["n"] > 0].reset_index(drop=True)
    y = np.arange(len(t))[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(t) + 1.6))
    acc = 100 * t["accuracy"].to_numpy(float)
    err = np.vstack([acc - 100 * t["ci_low"].to_numpy(float), 100 * t["ci_high"].to_numpy(float) - acc])
    ax.barh(y + 0.2, acc, height=0.4, xerr=err, color="tab:blue", label="best head (95% CI, sentence bootstrap)")
    ax.barh(
        y - 0.2, 100 * t["baseline_accuracy"].to_numpy(float), height=0.4, color="tab:gray", label="best fixed offset"
    )
    ax.scatter(
        100 * t["paper_accuracy"],
        y + 0.2,
        marker="D",
        color="black",
        zorder=3,
        label="paper: best head (BERT-base, PTB)",
    )
    ax.scatter(
        100 * t["paper_baseline"], y - 0.2, marker="|", s=120, color="black", zorder=3, label="paper: offset baseline"
    )
    labels = []
    for r in t.itertuples():
        name = r.relation if r.relation == r.paper_relation else f"{r.relation} ({r.paper_relation})"
        rare = "*" if getattr(r, "below_min_count", False) else ""
        labels.append(f"{name}  {r.label} {'>' if r.direction == 'dep->head' else '<'}  n={r.n}{rare}")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel("accuracy (%)")
    ax.set_title(
        f"{model}: best single head per relation ({corpus})\n'>' dependent attends to head, '<' head attends to dependent; "
        "(PTB name); * fewer dependents than the reporting threshold"
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    return fig


def plot_head_grid(heads: pd.DataFrame, relations: Sequence[str], model: str, corpus: str):
    """Layer x head heat maps of each relation's accuracy (best of the two directions)."""
    relations = [r for r in relations if r in set(heads["relation"])]
    n_layers, n_heads = head_shape(heads)
    panel_w = max(3.2, 0.22 * n_heads + 1.2)
    cols = panel_columns(len(relations), panel_w, most=4)
    rows = int(np.ceil(len(relations) / cols))
    panel_h = max(1.8, 0.16 * n_layers + 1.2)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_w * cols, panel_h * rows + 0.6), squeeze=False)
    best = heads.groupby(["relation", "layer", "head"])["accuracy"].max().reset_index()
    im = None
    for ax, rel in zip(axes.flat, relations):
        sub = best[best["relation"] == rel]
        grid = np.full((n_layers, n_heads), np.nan)
        grid[sub["layer"], sub["head"]] = 100 * sub["accuracy"]
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        n = int(heads.loc[heads["relation"] == rel, "n"].iloc[0])
        ax.set_title(f"{rel} (n={n}, max {np.nanmax(grid):.0f}%)", fontsize=9)
        layer_head_axes(ax, n_layers, n_heads)
    for ax in list(axes.flat)[len(relations) :]:
        ax.axis("off")
    fig.suptitle(f"{model}: accuracy of every head as a dependency parser ({corpus}), best direction", fontsize=10)
    fig.tight_layout()
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.6, label="accuracy (%)")
    return fig


def plot_table2(t: pd.DataFrame, model: str, corpora: str):
    """Antecedent selection accuracy by anaphor type: baselines and the best head, paper's as markers."""
    t = t[t["scored_on"] == "all"]
    systems = [s for s in ("Nearest", "Head match", "Rule-based", "Best head") if s in set(t["system"])]
    t = t.set_index("system")
    groups = ["all", "pronoun", "proper", "nominal"]
    x = np.arange(len(groups))
    w = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = ["tab:gray", "tab:olive", "tab:green", "tab:blue"]
    for i, (s, c) in enumerate(zip(systems, colors)):
        vals = [100 * t.loc[s, g] for g in groups]
        label = f"{s} {t.loc[s, 'label']}" if s == "Best head" else s
        ax.bar(x + (i - (len(systems) - 1) / 2) * w, vals, width=w, color=c, label=label)
        paper = [100 * t.loc[s, f"paper_{g}"] for g in groups]
        ax.scatter(
            x + (i - (len(systems) - 1) / 2) * w,
            paper,
            marker="D",
            color="black",
            s=14,
            zorder=3,
            label="paper (CoNLL-2012)" if i == 0 else None,
        )
    n = [int(t.loc["Best head", "n"])] + [int(t.loc["Best head", f"n_{g}"]) for g in groups[1:]]
    ax.set_xticks(x, [f"{g}\n(n={k})" for g, k in zip(groups, n)])
    ax.set_ylim(0, 100)
    ax.set_ylabel("antecedent selection accuracy (%)")
    ax.set_title(f"{model}: coreference head vs baselines ({corpora})")
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_coref_heads(heads: pd.DataFrame, model: str, corpora: str):
    """Layer x head heat map of antecedent selection accuracy (all anaphors)."""
    sub = heads[(heads["split"] == "all") & (heads["type"] == "all")]
    n_layers, n_heads = head_shape(sub)
    grid = np.full((n_layers, n_heads), np.nan)
    grid[sub["layer"], sub["head"]] = 100 * sub["accuracy"]
    fig, ax = plt.subplots(figsize=(0.35 * n_heads + 2.5, 0.22 * n_layers + 1.5))
    im = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0)
    layer_head_axes(ax, n_layers, n_heads, fontsize=8)
    ax.set_title(
        f"{model}: antecedent selection accuracy per head\n({corpora}, n={int(sub['n'].iloc[0])} anaphors)", fontsize=10
    )
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    return fig


def plot_table3(t: pd.DataFrame, model: str):
    """UAS of each probe on dev and test, paper's numbers as markers."""
    t = t[t["system"] != "Structural probe"].reset_index(drop=True)
    splits = [c for c in t.columns if c.startswith("uas_")]
    y = np.arange(len(t))[::-1]
    h = 0.8 / max(1, len(splits))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(t) + 1.5))
    for i, (s, c) in enumerate(zip(splits, ["tab:blue", "tab:orange"])):
        ax.barh(
            y - (i - (len(splits) - 1) / 2) * h,
            100 * t[s].to_numpy(float),
            height=h,
            color=c,
            label=f"{model} ({s[4:]})",
        )
    ax.scatter(t["paper_uas"], y, marker="D", color="black", zorder=3, label="paper (BERT-base, PTB dev)")
    names = [
        f"{r.system}" + (f"\n[{r.source_model}]" if r.source_model != model and isinstance(r.source_model, str) else "")
        for r in t.itertuples()
    ]
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlim(0, 100)
    ax.set_xlabel("UAS excluding punctuation (%)")
    ax.set_title(f"{model}: attention-based probing classifiers (UD EWT)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    return fig


# --- Fig. 5: example heads ----------------------------------------------------------


@dataclass
class Panel:
    title: str
    labels: list[str]  # unit labels
    attn: np.ndarray  # [U, U] word-level map of one head (rows attend to columns)
    arcs: list[tuple[int, int]]  # highlighted (from unit, to unit)
    row_scaled: bool = False  # opacity = weight / the row's largest weight in the panel


def unit_labels(record: Record, unit_word: np.ndarray, unit_special: np.ndarray) -> list[str]:
    return [
        record.words[w] if w >= 0 else f"[{SPECIAL_NAMES[int(s)].upper()}]" for w, s in zip(unit_word, unit_special)
    ]


def head_word_maps(store: AttentionStore, k: int, layer: int, head: int, mode: str = "mean") -> WordMaps:
    t = store.tokens(k)
    maps, uw, us = word_level(store.maps(layer, k, heads=slice(head, head + 1)), t["word"], t["special"], mode)
    return WordMaps(k, maps, uw, us)


def syntax_example(
    store: AttentionStore,
    records: Sequence[Record],
    relation: str,
    layer: int,
    head: int,
    direction: str,
    max_words: int = 18,
    mode: str = "mean",
) -> Panel | None:
    """The first sentence of at most ``max_words`` words with a ``relation`` arc that the head
    gets right for every such dependent (else the best one found)."""
    d = DIRECTIONS.index(direction)
    best = None
    for k in range(len(store)):
        r = records[store.record_index[k]]
        n = int(store.n_words[k])
        deps = [i for i in range(n) if r.deprel[i] == relation and 0 <= r.head[i] < n]
        if not deps or n > max_words:
            continue
        wm = head_word_maps(store, k, layer, head, mode)
        block = word_block(wm, n)
        pred = head_predictions(block.maps)[d, 0]
        rows = block.position[deps]
        ok = [rw >= 0 and pred[rw] >= 0 and block.word[pred[rw]] == r.head[i] for rw, i in zip(rows, deps)]
        score = sum(ok) / len(ok)
        if best is None or score > best[0]:
            unit_of = {int(block.word[i]): int(u) for i, u in enumerate(block.unit)}
            arcs = [
                (unit_of[i], unit_of[r.head[i]]) if d == 0 else (unit_of[r.head[i]], unit_of[i])
                for i in deps
                if i in unit_of and r.head[i] in unit_of
            ]
            arrow = "dependent -> head" if d == 0 else "head -> dependent"
            title = f"head {head_label(layer, head)}: {relation} ({arrow})"
            best = (score, Panel(title, unit_labels(r, wm.unit_word, wm.unit_special), wm.maps[0], arcs))
            if score == 1.0:
                break
    return None if best is None else best[1]


def coref_example(
    store: AttentionStore, records: Sequence[Record], layer: int, head: int, max_span: int = 16, mode: str = "mean"
) -> Panel | None:
    """The first anaphor (within ``max_span`` words of its predicted antecedent) that the head
    gets right; the panel shows the words between them."""
    for k in range(len(store)):
        r = records[store.record_index[k]]
        n = int(store.n_words[k])
        an = Anaphors([], [], [], [], [], [], [])
        idx = document_anaphors(r, n, "", an)
        if not idx:
            continue
        wm = head_word_maps(store, k, layer, head, mode)
        ok = attention_correct(wm, n, an.head, an.candidates, an.right)[:, 0]
        block = word_block(wm, n)
        for a in np.flatnonzero(ok):
            h = an.head[a]
            cands = an.candidates[a]
            pos = block.position[cands]
            row = block.maps[0, block.position[h]]
            scores = np.where(pos >= 0, row[np.clip(pos, 0, None)], -np.inf)
            ante = int(cands[int(np.argmax(scores))])
            if h - ante > max_span:
                continue
            lo, hi = max(0, ante - 2), min(n, h + 2)
            units = [int(block.unit[block.position[w]]) for w in range(lo, hi) if block.position[w] >= 0]
            labels = [r.words[int(wm.unit_word[u])] for u in units]
            a_row, a_col = (
                units.index(int(block.unit[block.position[h]])),
                units.index(int(block.unit[block.position[ante]])),
            )
            sub = np.zeros((len(units), len(units)), dtype=np.float32)
            sub[a_row] = wm.maps[0][units[a_row], units]  # only the anaphor's row
            title = f"head {head_label(layer, head)}: coreference ('{r.words[h]}' -> '{r.words[ante]}')\nthe mention head's row; opacity = weight / its largest weight here"
            return Panel(title, labels, sub, [(a_row, a_col)], row_scaled=True)
    return None


def plot_examples(panels: Sequence[Panel], model: str, min_weight: float = 0.02):
    """Clark's Fig. 5 style: each word (left) linked to the words it attends to (right), line
    opacity = attention weight; the gold arcs of the relation in red."""
    panels = [p for p in panels if p is not None]
    if not panels:
        raise ValueError("no example panel to draw")
    cols = min(3, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    height = max(len(p.labels) for p in panels) * 0.22 + 1.0
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, height * rows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        u = len(p.labels)
        ys = -np.arange(u)
        w = p.attn / np.maximum(p.attn.max(1, keepdims=True), 1e-12) if p.row_scaled else p.attn
        i, j = np.nonzero(w >= min_weight)
        for a, b in zip(i, j):
            ax.plot([0, 1], [ys[a], ys[b]], color="tab:blue", alpha=float(min(1.0, w[a, b])), lw=1.5)
        for a, b in p.arcs:
            ax.plot([0, 1], [ys[a], ys[b]], color="tab:red", lw=1.0, ls="--")
        for y, lab in zip(ys, p.labels):
            ax.text(-0.03, y, lab, ha="right", va="center", fontsize=8)
            ax.text(1.03, y, lab, ha="left", va="center", fontsize=8)
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylim(-u, 1)
        ax.axis("off")
        ax.set_title(p.title, fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"{model}: example heads (blue: attention from left word to right word, opacity = weight; red dashed: gold arcs)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def example_panels(
    relations: pd.DataFrame,
    table2: pd.DataFrame,
    syntax: tuple[AttentionStore, Sequence[Record]],
    coref: tuple[AttentionStore, Sequence[Record]],
    show: Sequence[str],
    *,
    max_words: int = 18,
    mode: str = "mean",
) -> list[Panel | None]:
    """Rule clark_syntax_examples: one :func:`syntax_example` panel per relation of ``show`` that is
    among the best heads' ``relations`` (syntax/relations.tsv; others are skipped with a log line),
    then the :func:`coref_example` of Table 2's best head (``table2``, scored on all anaphors).
    ``syntax`` and ``coref`` are (store, records) pairs: the stored maps of a corpus, all of a ``maps: full``
    corpus, the seeded sample of a ``maps: sample`` one (the tables themselves come from the reducers)."""
    best = relations.set_index("relation")
    panels: list[Panel | None] = []
    store, records = syntax
    for rel in show:
        if rel not in best.index:
            log.info("relation %s: not among the reported relations; no panel", rel)
            continue
        b = best.loc[rel]
        panels.append(
            syntax_example(store, records, rel, int(b["layer"]), int(b["head"]), b["direction"], max_words, mode)
        )
    t2 = table2[table2["scored_on"] == "all"].set_index("system")
    store, records = coref
    panels.append(
        coref_example(store, records, int(t2.loc["Best head", "layer"]), int(t2.loc["Best head", "head"]), mode=mode)
    )
    return panels
