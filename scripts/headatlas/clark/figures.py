"""Figures after Clark et al. 2019: Fig. 1 (example heads), 2 (surface patterns), 3 (gradient
importance), 4 (entropies), 6 (MDS of head distances). Every function returns a matplotlib
Figure; :func:`headatlas.core.figures.save_figure` writes its PNG and SVG. Layers and heads are printed 1-based, as
in the paper."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.figures import head_label
from ..core.io import layer_count
from .surface import ExampleSettings, best_heads, example_index, punct_mask

LABEL_COLOURS = {
    "next": "#1f77b4",
    "prev": "#17becf",
    "broad": "#2ca02c",
    "cls": "#d62728",
    "bos": "#d62728",
    "sep": "#9467bd",
    "punct": "#ff7f0e",
    "other": "#b0b0b0",
}
LABEL_NAMES = {
    "next": "next token",
    "prev": "previous token",
    "broad": "broad",
    "cls": "[CLS]",
    "bos": "BOS",
    "sep": "[SEP]",
    "punct": ". ,",
    "other": "other",
}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet back to bytes (the inverse of ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTE_DECODER = _byte_decoder()


def display_token(piece: str) -> str:
    """A token as printed in a figure: byte-level BPE pieces decoded to text (space marks
    dropped), other pieces unchanged; a piece that is not valid UTF-8 on its own stays as is."""
    if all(ch in BYTE_DECODER for ch in piece):
        try:
            text = bytes(BYTE_DECODER[ch] for ch in piece).decode("utf-8")
        except UnicodeDecodeError:
            return piece
        text = text.replace("\n", "\\n").strip()
        return text if text else "␣"
    return piece.replace("▁", "") or piece


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _jitter(n: int, width: float = 0.25) -> np.ndarray:
    return np.linspace(-width, width, n) if n > 1 else np.zeros(n)


def layer_dots(ax, table: pd.DataFrame, column: str, colour: str = "#1f77b4", label: str | None = None) -> bool:
    """Clark's Fig. 2 style: one dot per head at its layer (1-based), a line through the layer
    means. Returns False (and writes why in the panel) when the column is undefined."""
    values = table[column].to_numpy(dtype=float)
    if np.isnan(values).all():
        return False
    layers = table["layer"].to_numpy()
    heads = table["head"].to_numpy()
    n_heads = int(heads.max()) + 1
    x = layers + 1 + _jitter(n_heads, 0.2)[heads]
    ax.scatter(x, values, s=10, color=colour, alpha=0.6, linewidths=0, label=f"{label} (heads)" if label else "heads")
    means = table.groupby("layer")[column].mean()
    ax.plot(
        means.index + 1,
        means.to_numpy(),
        color=colour,
        lw=1.8,
        label=f"{label} (layer mean)" if label else "layer mean",
    )
    return True


def _na(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="#555555", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _layer_axis(ax, n_layers: int) -> None:
    step = 1 if n_layers <= 12 else (2 if n_layers <= 24 else 5)
    ticks = [1] + list(range(step, n_layers + 1, step)) if step > 1 else list(range(1, n_layers + 1))
    ax.set_xticks(sorted(set(ticks)))
    ax.set_xlim(0.4, n_layers + 0.6)
    ax.set_xlabel("layer (1-based)")


def fig2_surface(table: pd.DataFrame, model: str, corpus: str):
    """Fig. 2: mean attention to [CLS]/BOS, [SEP], ". ,"; [SEP]->[SEP] and other->[SEP]; next,
    previous and current token; per head (dots) and per layer (line)."""
    plt = _plt()
    decoder = table.get("model_kind", pd.Series(["encoder"])).iloc[0] == "decoder"
    n_layers = layer_count(table)
    first = "BOS" if decoder else "[CLS]"
    panels = [
        ("cls", f"attention to {first}", "#d62728", f"no {first} token in the sequences"),
        ("sep", "attention to [SEP] (both)", "#9467bd", "decoder: there is no [SEP] token"),
        ("punct", 'attention to ". ,"', "#ff7f0e", "no . or , token"),
        ("sep_to_sep", "[SEP] -> [SEP]", "#9467bd", "decoder: there is no [SEP] token"),
        ("other_to_sep", "other -> [SEP]", "#8c564b", "decoder: there is no [SEP] token"),
        (None, None, None, None),
        ("next", "attention to next token", "#1f77b4", "decoder: the causal mask hides the next token"),
        ("prev", "attention to previous token", "#17becf", ""),
        ("self", "attention to current token", "#7f7f7f", ""),
    ]
    width = 11 if n_layers <= 12 else 14
    fig, axes = plt.subplots(3, 3, figsize=(width, 8.5), sharex=False)
    for ax, (col, title, colour, why) in zip(axes.flat, panels):
        if col is None:
            ax.axis("off")
            continue
        if layer_dots(ax, table, col, colour):
            _layer_axis(ax, n_layers)
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("mean attention")
        else:
            _na(ax, f"not defined:\n{why}")
        ax.set_title(title, fontsize=10)
    from matplotlib.lines import Line2D

    proxies = [
        Line2D([], [], ls="", marker="o", ms=4, color="#555555", alpha=0.6),
        Line2D([], [], color="#555555", lw=1.8),
    ]
    axes[1, 2].legend(proxies, ["one head (x jittered)", "mean over the layer's heads"], loc="center", frameon=False)
    n_seq = int(table["n_sequences"].iloc[0])
    fig.suptitle(
        f"{model}: where heads attend (Clark et al. Fig. 2 analogue), {corpus}, {n_seq} sequences", fontsize=12
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def fig4_entropy(table: pd.DataFrame, model: str, corpus: str, broad_entropy: float = 3.8):
    """Fig. 4: mean row entropy per head by layer, with the uniform-attention reference; and the
    entropy of the summary token's row ([CLS], or the last token of a decoder)."""
    plt = _plt()
    decoder = table.get("model_kind", pd.Series(["encoder"])).iloc[0] == "decoder"
    n_layers = layer_count(table)
    fig, axes = plt.subplots(1, 2, figsize=(12 if n_layers <= 12 else 15, 5.0))
    panels = [
        (
            "entropy",
            "entropy_uniform",
            "mean entropy of a head's rows",
            "uniform attention" + (" (causal: mean ln(i+1))" if decoder else " (ln n)"),
        ),
        (
            "cls_entropy",
            "cls_entropy_uniform",
            "entropy of the " + ("last token's row" if decoder else "[CLS] row"),
            "uniform attention (ln n)",
        ),
    ]
    for ax, (col, ref, title, ref_label) in zip(axes, panels):
        layer_dots(ax, table, col, "#2ca02c")
        ax.axhline(table[ref].mean(), color="black", ls="--", lw=1, label=ref_label)
        if col == "entropy":
            ax.axhline(broad_entropy, color="#2ca02c", ls=":", lw=1, label=f"'broad' threshold {broad_entropy:g}")
        _layer_axis(ax, n_layers)
        ax.set_ylabel("entropy (nats)")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.suptitle(f"{model}: attention entropy (Clark et al. Fig. 4 analogue), {corpus}", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


GRADIENT_STYLE = {
    "sep_bos": ("#9467bd", "-", None),
    "punct": ("#ff7f0e", "-", '". ,"'),
    "cls": ("#d62728", "--", "[CLS]"),
    "other": ("#7f7f7f", "-", "other"),
}


def fig3_gradients(table: pd.DataFrame, model: str, corpus: str):
    """Fig. 3: mean |dL/dA| per layer by key type; a panel that says why for a skipped model."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    if table.empty or (table["status"] == "skipped").all():
        reason = table["reason"].iloc[0] if not table.empty else "no data"
        _na(ax, "gradient importance skipped:\n" + "\n".join(_wrap(str(reason), 70)))
        ax.set_title(f"{model}: gradient importance not computed", fontsize=11)
        return fig
    decoder = table["model_kind"].iloc[0] == "decoder"
    for key, (colour, ls, name) in GRADIENT_STYLE.items():
        part = table[table["key_type"] == key].sort_values("layer")
        if part.empty:
            continue
        label = name or ("BOS" if decoder else "[SEP]")
        ax.plot(part["layer"] + 1, part["mean_abs_grad"], color=colour, ls=ls, marker="o", ms=3, label=label)
    n_layers = layer_count(table)
    _layer_axis(ax, n_layers)
    ax.set_yscale("log")
    ax.set_ylabel("mean |dL/d attention| (log scale)")
    loss = "causal-LM" if decoder else "masked-LM (15% masking)"
    n = int(table["n_sequences"].iloc[0])
    ax.set_title(
        f"{model}: gradient of the {loss} loss w.r.t. attention\nby key type (Clark et al. Fig. 3 analogue), {corpus}, {n} sequences",
        fontsize=10,
    )
    ax.legend(title="attention to", fontsize=8)
    fig.tight_layout()
    return fig


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def fig6_mds(heads: pd.DataFrame, model: str, corpus: str, stats: dict | None = None):
    """Fig. 6: 2-D MDS of the JS distances between heads, coloured by behaviour and by layer."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.6))
    x, y = heads["mds_x"].to_numpy(), heads["mds_y"].to_numpy()
    ax = axes[0]
    present = [lab for lab in LABEL_COLOURS if (heads["label"] == lab).any()]
    for lab in ["other"] + [p for p in present if p != "other"]:
        sel = heads["label"].to_numpy() == lab
        if sel.any():
            ax.scatter(
                x[sel],
                y[sel],
                s=22,
                color=LABEL_COLOURS[lab],
                label=f"{LABEL_NAMES[lab]} ({sel.sum()})",
                edgecolors="white",
                linewidths=0.3,
            )
    ax.legend(title="behaviour (Clark thresholds)", fontsize=8, title_fontsize=8, loc="best")
    ax.set_title("coloured by behaviour", fontsize=10)
    ax = axes[1]
    layers = heads["layer"].to_numpy() + 1
    sc = ax.scatter(x, y, c=layers, cmap="viridis", s=22, edgecolors="white", linewidths=0.3)
    cb = fig.colorbar(sc, ax=ax)
    cb.set_label("layer (1-based)")
    ax.set_title("coloured by layer", fontsize=10)
    for ax in axes:
        ax.set_xlabel("MDS dimension 1")
        ax.set_ylabel("MDS dimension 2")
        ax.set_aspect("equal", adjustable="datalim")
    title = f"{model}: heads embedded by Jensen-Shannon distance (Clark et al. Fig. 6 analogue), {corpus}"
    if stats:
        title += (
            f"\nmean JS per token within layer {stats['within_layer']:.3f} vs between layers {stats['between_layer']:.3f} nats"
            f" (permutation p = {stats['p_value']:.2g}, {int(stats['permutations'])} permutations)"
        )
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def attention_lines(
    ax, attn: np.ndarray, tokens, title: str = "", min_weight: float = 0.01, colour: str = "#1f77b4"
) -> None:
    """Clark's Fig. 1 style: tokens in two columns (query left, key right) and a line from each
    query to each key with opacity equal to its attention weight (weights below ``min_weight``
    are not drawn)."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_rgb

    n = len(tokens)
    qi, kj = np.nonzero(attn >= min_weight)
    segs = np.stack([np.stack([np.zeros(len(qi)), -qi], 1), np.stack([np.ones(len(kj)), -kj], 1)], 1)
    rgba = np.zeros((len(qi), 4))
    rgba[:, :3] = to_rgb(colour)
    rgba[:, 3] = np.clip(attn[qi, kj], 0, 1)
    ax.add_collection(LineCollection(segs, colors=rgba, linewidths=1.5))
    fs = 8 if n <= 30 else (6 if n <= 50 else 4)
    for i, t in enumerate(tokens):
        ax.text(-0.04, -i, t, ha="right", va="center", fontsize=fs)
        ax.text(1.04, -i, t, ha="left", va="center", fontsize=fs)
    ax.set_xlim(-0.7, 1.7)
    ax.set_ylim(-n + 0.5, 0.5)
    ax.axis("off")
    ax.set_title(title, fontsize=9)


STAT_NAMES = {
    "prev": "mean attention to prev.",
    "next": "mean attention to next",
    "cls": "mean attention to [CLS]/BOS",
    "sep": "mean attention to [SEP]",
    "punct": 'mean attention to ". ,"',
    "entropy": "mean entropy (nats)",
}


def fig1_examples(examples: pd.DataFrame, maps: dict, tokens, model: str, corpus: str, min_weight: float = 0.01):
    """Fig. 1: line diagrams of the best head of each behaviour on one example sequence.

    ``examples`` has behaviour, layer, head, score, statistic; ``maps[(layer, head)]`` is that
    head's [n, n] map; ``tokens`` the n token strings."""
    plt = _plt()
    k = len(examples)
    n = len(tokens)
    fig, axes = plt.subplots(1, max(k, 1), figsize=(3.1 * max(k, 1), 0.22 * n + 1.6), squeeze=False)
    for ax, row in zip(axes[0], examples.itertuples()):
        colour = LABEL_COLOURS.get(row.behaviour, "#1f77b4")
        what = STAT_NAMES.get(row.statistic, row.statistic)
        title = f"{LABEL_NAMES.get(row.behaviour, row.behaviour)}: head {head_label(row.layer, row.head)}\n{what} {row.score:.2f}"
        attention_lines(ax, maps[(row.layer, row.head)], tokens, title, min_weight, colour)
    if k == 0:
        _na(axes[0][0], "no head to show")
    fig.suptitle(
        f"{model}: the strongest head of each behaviour on one {corpus} sequence (Clark et al. Fig. 1 analogue)\n"
        "left column: query tokens, right column: key tokens, line opacity = attention weight; heads are layer-head, 1-based",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95 if n > 20 else 0.88))
    return fig


def example_heads(store, behaviour: pd.DataFrame, settings: ExampleSettings = ExampleSettings()):
    """Fig. 1's data: the strongest head of each behaviour (:func:`best_heads`) on one stored sequence,
    the one whose length is closest to ``settings.n_tokens`` among those with a period or comma (so
    every behaviour has something to show). Returns (table with sequence, record_id, n_tokens;
    {(layer, head): map}; display tokens)."""
    best = best_heads(behaviour)
    has_punct = np.add.reduceat(punct_mask(store.piece, store.special).astype(int), store.token_offsets[:-1]) > 0
    k = example_index(store.lengths, settings.n_tokens, has_punct)
    maps = {(r.layer, r.head): store.maps(r.layer, k, r.head) for r in best.itertuples()}
    tokens = [display_token(p) for p in store.tokens(k)["piece"]]
    return best.assign(sequence=k, record_id=store.record_id[k], n_tokens=len(tokens)), maps, tokens


def examples_figure(store, behaviour: pd.DataFrame, model: str, corpus: str, settings: ExampleSettings):
    """Rule clark_examples: the table of :func:`example_heads` and its Fig. 1."""
    table, maps, tokens = example_heads(store, behaviour, settings)
    return table, fig1_examples(table, maps, tokens, model, corpus, settings.min_weight)
