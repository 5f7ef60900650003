"""Surface statistics per head (Clark et al. 2019, Sec. 3; formulas in shared methods §3.3).

For each sequence (n tokens) and head, with A the n x n map (rows = queries):
- next / prev / self: (1/n) sum_i A[i, i+1] / A[i, i-1] / A[i, i]
- cls, sep, punct: (1/n) sum_i sum_{j in T} A[i, j], T = every position of that type (both [SEP]s);
  punct = the tokens "." and ","
- sep_to_sep: mean over [SEP] rows of their mass on [SEP]s; other_to_sep: the same over the other rows
- entropy: mean over rows of -sum_j A'_ij ln A'_ij (nats), A' = (1-eps) A + eps/k_i, where k_i is the
  number of keys row i may attend to; uniform: mean_i ln k_i (the entropy of a uniform head)
- cls_entropy: the same for the row of the sequence-summary token, with cls_entropy_uniform = ln n

Decoders (causal mask): k_i = i + 1 and smoothing spreads eps over the allowed keys j <= i only;
BOS takes [CLS]'s part in ``cls``; ``next`` is undefined (a query cannot see the next token) and
there is no [SEP], so next, sep, sep_to_sep and other_to_sep are NaN. BOS's own row is trivially
one-hot, so ``cls_entropy`` of a decoder is read at the last token, the one that sees the whole
sequence (the position a decoder's sequence representation is read from).

Each statistic is averaged over sequences, ignoring sequences where it is undefined (a sequence
without [SEP], for example).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_NONE
from ..core.io import layer_count
from ..core.settings import Settings

PUNCT = {".", ","}
STATS = [
    "next",
    "prev",
    "self",
    "cls",
    "sep",
    "punct",
    "sep_to_sep",
    "other_to_sep",
    "entropy",
    "entropy_uniform",
    "cls_entropy",
    "cls_entropy_uniform",
]
# the statistics that are attention shares (in [0, 1]; the rest are entropies): what a reader of surface.tsv checks
SHARE_STATS = STATS[:8]
# Behaviour labels in Clark's override order: a later rule overrides an earlier one.
LABEL_ORDER = ["next", "prev", "broad", "cls", "sep", "punct"]


@dataclass(frozen=True, kw_only=True)
class GradientSettings(Settings):
    """analysis.clark_surface.gradients (``threads`` goes to the rule)."""

    SECTION = "analysis.clark_surface.gradients"

    n_segments: int = 100
    mask_prob: float = 0.15
    seed: int = 0
    batch_size: int = 4


@dataclass(frozen=True, kw_only=True)
class ClusteringSettings(Settings):
    """analysis.clark_surface.clustering: the JS distances and their MDS."""

    SECTION = "analysis.clark_surface.clustering"

    n_segments: int = 200
    smoothing: float = 1e-3
    max_elements: int = 1_000_000
    max_heads: int | None = 512
    mds_n_init: int = 5
    mds_max_iter: int = 1000
    mds_eps: float = 1e-10
    seed: int = 0
    permutations: int = 1000


@dataclass(frozen=True, kw_only=True)
class ExampleSettings(Settings):
    """analysis.clark_surface.examples: Fig. 1's sequence length and the weights drawn."""

    SECTION = "analysis.clark_surface.examples"

    n_tokens: int = 24
    min_weight: float = 0.01


@dataclass(frozen=True, kw_only=True)
class SurfaceSettings(Settings):
    """analysis.clark_surface (workflow/schemas/clark_surface.schema.yaml); a rule passes the keys it reads."""

    SECTION = "analysis.clark_surface"

    long_corpora: tuple[str, ...] = ()  # corpora with the per-head surface statistics only (fused_plan, the targets)
    smoothing: float = 1e-4
    broad_entropy: float = 3.8
    offset_threshold: float = 0.5
    special_threshold: float = 0.6
    gradients: GradientSettings = field(default_factory=GradientSettings)
    clustering: ClusteringSettings = field(default_factory=ClusteringSettings)
    examples: ExampleSettings = field(default_factory=ExampleSettings)


def normalise_piece(piece: str) -> str:
    """A token's text without WordPiece '##' and byte-level/SentencePiece space marks."""
    return piece.replace("##", "").lstrip("Ġ▁ ")


def punct_mask(piece, special) -> np.ndarray:
    """True for the non-special tokens "." and "," (Clark's ". ," key type)."""
    if len(piece) == 0:
        return np.zeros(0, dtype=bool)
    text = np.char.lstrip(np.char.replace(np.asarray(piece, dtype=str), "##", ""), "Ġ▁ ")  # normalise_piece, vectorised
    return np.isin(text, sorted(PUNCT)) & (np.asarray(special) == SPECIAL_NONE)


def behaviour_labels(
    table: pd.DataFrame, broad_entropy: float = 3.8, offset_threshold: float = 0.5, special_threshold: float = 0.6
) -> pd.Series:
    """Clark et al.'s behaviour label per head (their Fig. 6 colouring).

    broad if entropy > ``broad_entropy`` nats; next / prev if the mean attention to that
    offset > ``offset_threshold``; cls / sep / punct if the mean attention to that key type
    > ``special_threshold``; a later rule overrides an earlier one in the order next, prev,
    broad, cls, sep, punct; 'other' if none applies. Decoders are labelled 'bos' where an
    encoder would be 'cls'. NaN statistics never match.
    """
    label = pd.Series("other", index=table.index, dtype=object)
    tests = {
        "next": table["next"] > offset_threshold,
        "prev": table["prev"] > offset_threshold,
        "broad": table["entropy"] > broad_entropy,
        "cls": table["cls"] > special_threshold,
        "sep": table["sep"] > special_threshold,
        "punct": table["punct"] > special_threshold,
    }
    decoder = table["model_kind"].eq("decoder") if "model_kind" in table else pd.Series(False, index=table.index)
    for name in LABEL_ORDER:
        hit = tests[name].fillna(False).astype(bool)
        label[hit] = name
    label[decoder & label.eq("cls")] = "bos"
    return label


def behaviour_table(table: pd.DataFrame, settings: SurfaceSettings = SurfaceSettings()) -> pd.DataFrame:
    """The surface table with a ``label`` column after model, model_kind, layer, head."""
    out = table.copy()
    s = settings
    out.insert(4, "label", behaviour_labels(table, s.broad_entropy, s.offset_threshold, s.special_threshold))
    return out


def layer_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per-layer means of every statistic (the lines of Clark's Fig. 2 and Fig. 4)."""
    return table.groupby(["model", "layer"], as_index=False)[STATS].mean()


BEST_HEAD_STATS = [
    ("prev", "prev"),
    ("next", "next"),
    ("cls", "cls"),
    ("sep", "sep"),
    ("punct", "punct"),
    ("broad", "entropy"),
]


def best_heads(table: pd.DataFrame) -> pd.DataFrame:
    """The head with the highest score of each behaviour (broad: the highest entropy).

    Columns: behaviour, layer, head, statistic, score. Behaviours whose statistic is undefined
    for the model (next and [SEP] in a decoder) are left out; a decoder's [CLS] row is 'bos'.
    """
    decoder = "model_kind" in table and (table["model_kind"] == "decoder").any()
    rows = []
    for behaviour, stat in BEST_HEAD_STATS:
        values = table[stat]
        if values.isna().all():
            continue
        i = values.idxmax()
        name = "bos" if (behaviour == "cls" and decoder) else behaviour
        rows.append(
            {
                "behaviour": name,
                "layer": int(table.at[i, "layer"]),
                "head": int(table.at[i, "head"]),
                "statistic": stat,
                "score": float(values[i]),
            }
        )
    return pd.DataFrame(rows, columns=["behaviour", "layer", "head", "statistic", "score"])


def example_index(lengths: np.ndarray, n_tokens: int, eligible: np.ndarray | None = None) -> int:
    """The first sequence whose length is closest to ``n_tokens`` (the example of Fig. 1),
    among the ``eligible`` ones (all when none is, or when no mask is given)."""
    lengths = np.asarray(lengths)
    gap = np.abs(lengths - n_tokens).astype(float)
    if eligible is not None and np.asarray(eligible).any():
        gap[~np.asarray(eligible, dtype=bool)] = np.inf
    return int(np.argmin(gap))


def relative_layers(n_layers: int, first: int, last: int, of: int = 12) -> np.ndarray:
    """0-based layers of an n_layers model at the relative depth of 1-based layers first..last
    of an ``of``-layer model (BERT-base: 12): 1-based layer l is kept when
    (first - 1) / of < l / n_layers <= last / of."""
    pos = (np.arange(n_layers) + 1) / n_layers
    sel = np.flatnonzero((pos > (first - 1) / of + 1e-9) & (pos <= last / of + 1e-9))
    if len(sel) == 0:  # a very shallow model: the nearest layer
        sel = np.array([int(np.argmin(np.abs(pos - (first + last) / (2 * of))))])
    return sel


def clark_headlines(
    behaviour: pd.DataFrame,
    clustering: dict | None = None,
    gradients: pd.DataFrame | None = None,
    broad_entropy: float = 3.8,
) -> pd.DataFrame:
    """Clark et al.'s headline claims beside this model's analogue (one row per claim).

    Columns: claim, paper, measured, measure, holds ('yes', 'no' or 'not applicable'). Middle / deep /
    early layers are taken at BERT-base's relative depth (see :func:`relative_layers`).
    """
    t = behaviour
    n_layers = layer_count(t)
    decoder = (t.get("model_kind", pd.Series(["encoder"])) == "decoder").any()
    by_layer = t.groupby("layer")
    rows = []

    def add(claim, paper, measured, measure, holds):
        ok = (
            "not applicable"
            if holds is None or (isinstance(measured, float) and np.isnan(measured))
            else ("yes" if holds else "no")
        )
        rows.append({"claim": claim, "paper": paper, "measured": measured, "measure": measure, "holds": ok})

    self_med = float(t["self"].median())
    add(
        "most heads put little attention on the current token",
        "little (Fig. 2)",
        self_med,
        "median over heads of mean attention to the current token",
        self_med < 0.1,
    )
    mid = relative_layers(n_layers, 6, 10)
    mid_names = f"layers {mid[0] + 1}-{mid[-1] + 1}"
    sep_mid = float(t[t["layer"].isin(mid)]["sep"].mean())
    add(
        "over half of the attention in middle layers goes to [SEP]",
        "> 0.5 in layers 6-10 of 12",
        sep_mid,
        f"mean attention to [SEP] in {mid_names}",
        sep_mid > 0.5,
    )
    first_mid = float(t[t["layer"].isin(mid)]["cls"].mean())
    add(
        f"(analogue) share of middle-layer attention on {'BOS' if decoder else '[CLS]'}",
        "small in BERT (the [SEP] sink)" if not decoder else "BOS plays the no-op sink in decoders",
        first_mid,
        f"mean attention to {'BOS' if decoder else '[CLS]'} in {mid_names}",
        None,
    )
    sep_heads = t[t["sep"] > 0.6]
    s2s = float(sep_heads["sep_to_sep"].mean()) if len(sep_heads) else float("nan")
    add(
        "[SEP]-attending heads send > 90% of [SEP]'s attention to [SEP]s",
        "> 0.9",
        s2s,
        f"mean [SEP]->[SEP] over the {len(sep_heads)} heads with [SEP] > 0.6",
        s2s > 0.9,
    )
    early = relative_layers(n_layers, 1, 4)
    deep = relative_layers(n_layers, 9, 12)
    for col, name, where, sel in (
        ("cls", "BOS" if decoder else "[CLS]", "early", early),
        ("punct", "periods and commas", "deep", deep),
    ):
        means = by_layer[col].mean()
        peak = int(means.idxmax()) if not means.isna().all() else -1
        add(
            f"{where} layers attend most to {name}",
            f"peak of {name} in {where} layers",
            float(peak + 1) if peak >= 0 else float("nan"),
            f"1-based layer with the highest mean attention to {name} ({where}: layers {sel[0] + 1}-{sel[-1] + 1})",
            peak in set(sel.tolist()),
        )
    last = t[t["layer"] == n_layers - 1]
    ent = float(last["cls_entropy"].mean())
    ref = float(last["cls_entropy_uniform"].mean())
    summary = "last token's" if decoder else "[CLS]"
    add(
        f"last-layer {summary} row attends broadly",
        "3.89 nats (uniform about 4.5-4.8)",
        ent,
        f"mean entropy of the {summary} row in the last layer (uniform here {ref:.2f})",
        ent > 0.8 * ref,
    )
    for col, paper in (("prev", 4), ("next", 5)):
        n = float((t[col] > 0.5).sum()) if t[col].notna().any() else float("nan")
        add(
            f"heads with > 50% of their attention on the {'previous' if col == 'prev' else 'next'} token",
            f"{paper} of 144",
            n,
            f"heads of {len(t)}",
            n > 0,
        )
    broad = t["entropy"] > broad_entropy
    n_broad, n_low = int(broad.sum()), int((broad & (t["layer"] < n_layers / 2)).sum())
    add(
        f"broad heads (entropy > {broad_entropy:g}) are mostly in lower layers",
        "mostly lower layers",
        float(n_broad),
        f"broad heads of {len(t)} ({n_low} in the lower half of the layers)",
        None if n_broad == 0 else n_low >= n_broad / 2,
    )
    ok = gradients is not None and not gradients.empty and (gradients["status"] == "ok").any()
    piv = (
        gradients[gradients["status"] == "ok"].pivot_table(index="layer", columns="key_type", values="mean_abs_grad")
        if ok
        else None
    )
    if ok and "sep_bos" not in piv:  # a decoder that gets no BOS token (Qwen2): nothing to compare
        add(
            "from layer 5 on, gradients for attention to BOS are small",
            "very small from layer 5 (Fig. 3)",
            float("nan"),
            "skipped: the model gets no BOS token (config key bos_token)",
            None,
        )
    elif ok:
        ratio = piv["sep_bos"] / piv["other"]
        from_5 = relative_layers(n_layers, 5, 12)
        before = np.setdiff1d(np.arange(n_layers), from_5)
        late, early_r = (
            float(ratio.loc[from_5].mean()),
            float(ratio.loc[before].mean()) if len(before) else float("nan"),
        )
        key = "BOS" if decoder else "[SEP]"
        add(
            f"from layer 5 on, gradients for attention to {key} are small",
            "very small from layer 5 (Fig. 3)",
            late,
            f"mean |dL/dA| to {key} / to other tokens in layers {from_5[0] + 1}-{n_layers} (before: {early_r:.2f})",
            late < 1 and (np.isnan(early_r) or late < early_r),
        )
    else:
        add(
            "from layer 5 on, gradients for attention to [SEP] are small",
            "very small from layer 5 (Fig. 3)",
            float("nan"),
            "skipped: no LM head",
            None,
        )
    if clustering:
        add(
            "heads in the same layer cluster together",
            "same-layer heads close in Fig. 6",
            clustering["ratio"],
            f"mean JS between / within layers ({clustering['between_layer']:.3f} / {clustering['within_layer']:.3f} nats per token, permutation p = {clustering['p_value']:.3g})",
            clustering["ratio"] > 1 and clustering["p_value"] < 0.05,
        )
    return pd.DataFrame(rows, columns=["claim", "paper", "measured", "measure", "holds"])
