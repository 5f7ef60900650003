"""Single attention heads as dependency parsers (Clark et al. 2019, Sec. 4.2, Table 1).

Word-level maps (Clark's aggregation, :func:`headatlas.core.store.word_level`) of every head are
read once per sentence. Restricted to the words (special tokens removed), a head predicts the
head word of dependent d in two directions:

- ``dep->head``: the word d attends to most, argmax_j A[d, j];
- ``head->dep``: the word that attends most to d, argmax_j A[j, d].

Self is excluded and ROOT is never predicted, so root words always count as wrong; "All"
counts every word, punctuation and root included (as Clark's notebook). A row with no
positive weight on any other word (the first word of a causal model in ``dep->head``)
predicts nothing and counts as wrong. Possessives (Clark's ``poss`` rule): when a
``nmod:poss`` dependent is followed by ``'s``, the prediction of ``'s`` is used instead.

The fixed-offset baseline predicts word d + k for k in ``offsets``; a position outside the
sentence predicts nothing (Clark's notebook clips it to ROOT or the last word instead; we do
not, so that, like a head, the baseline never predicts ROOT, and a head that attends to the
word at offset k, or to a special token when there is none, matches it exactly).

Confidence intervals are percentile bootstraps that resample sentences (the dependents of
one sentence are not independent), with a generator seeded per relation.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from ..core.bootstrap import bootstrap_ci
from ..core.data import SPECIAL_NONE, Record
from ..core.figures import head_label
from ..core.settings import Settings
from ..core.store import AttentionStore, budget_runs
from ..core.store import word_level as store_word_level

DIRECTIONS = ("dep->head", "head->dep")
DEFAULT_OFFSETS = (-3, -2, -1, 0, 1, 2)

POSS_RELATIONS = ("nmod:poss",)
POSS_MARKERS = ("'s", "'", "s'", "\u2019s", "\u2019")
ALL = "All"

# Clark et al. Table 1 relation (Stanford Dependencies on the PTB) -> UD English EWT relation(s).
RELATION_MAP = pd.DataFrame(
    [
        ("All", "All", "exact", "every word; punctuation and root included"),
        (
            "prep",
            "obl",
            "other dependent",
            "SD prep: preposition -> the word its phrase modifies; UD obl: the phrase's noun -> that word (same head word, the noun instead of the preposition)",
        ),
        ("prep", "nmod", "other dependent", "as obl, for phrases that modify a noun"),
        (
            "pobj",
            "case",
            "reversed",
            "SD pobj: noun -> its preposition; UD case: preposition -> its noun (same word pair, reversed); Clark's pobj head (prepositions attend to their objects) is a case head in the dep->head direction",
        ),
        ("det", "det", "same", ""),
        ("nn", "compound", "same", "noun compound modifier"),
        ("nsubj", "nsubj", "same", ""),
        ("amod", "amod", "same", ""),
        ("dobj", "obj", "same", ""),
        ("advmod", "advmod", "same", ""),
        ("aux", "aux", "close", "UD aux excludes the copula (cop) and passive auxiliaries, as SD"),
        ("poss", "nmod:poss", "same", "the 's rule applies, as Clark"),
        ("auxpass", "aux:pass", "same", ""),
        ("ccomp", "ccomp", "close", "UD heads a copular clause by its predicate, SD by the verb"),
        ("mark", "mark", "close", "UD mark also covers infinitival 'to' (SD aux)"),
        ("prt", "compound:prt", "same", "verb particle"),
    ],
    columns=["paper_relation", "relation", "correspondence", "note"],
)

# Clark et al. 2019 Table 1 (BERT-base, PTB dev): head 1-based "layer-head", accuracy, best offset baseline
# (as printed, in %; converted to fractions below).
PAPER_TABLE1 = pd.DataFrame(
    [
        ("All", "7-6", 34.5, 26.3, "1"),
        ("prep", "7-4", 66.7, 61.8, "-1"),
        ("pobj", "9-6", 76.3, 34.6, "-2"),
        ("det", "8-11", 94.3, 51.7, "1"),
        ("nn", "4-10", 70.4, 70.2, "1"),
        ("nsubj", "8-2", 58.5, 45.5, "1"),
        ("amod", "4-10", 75.6, 68.3, "1"),
        ("dobj", "8-10", 86.8, 40.0, "-2"),
        ("advmod", "7-6", 48.8, 40.2, "1"),
        ("aux", "4-10", 81.1, 71.5, "1"),
        ("poss", "7-6", 80.5, 47.7, "1"),
        ("auxpass", "4-10", 82.5, 40.5, "1"),
        ("ccomp", "8-1", 48.8, 12.4, "-2"),
        ("mark", "8-2", 50.7, 14.5, "2"),
        ("prt", "6-7", 99.1, 91.4, "-1"),
    ],
    columns=["paper_relation", "paper_head", "paper_accuracy", "paper_baseline", "paper_offset"],
)
# the paper prints percentages; every accuracy column here is a fraction in [0, 1]
PAPER_TABLE1[["paper_accuracy", "paper_baseline"]] = (PAPER_TABLE1[["paper_accuracy", "paper_baseline"]] / 100).round(4)


@dataclass(frozen=True)
class WordMaps:
    """Word-level maps of all heads of one sequence: [L*H, U, U] over units (words and
    special tokens, each its own unit), with each unit's record word (-1 for specials)."""

    k: int  # sequence index in the store
    maps: np.ndarray
    unit_word: np.ndarray
    unit_special: np.ndarray

    def words(self) -> "WordBlock":
        return word_block(self)


@dataclass(frozen=True)
class WordBlock:
    maps: np.ndarray | None  # [K, W, W] among the words that have units (None: built from predictions)
    word: np.ndarray  # [W] record word index of each row
    position: np.ndarray  # [n_words] row of each record word, -1 for words without pieces
    unit: np.ndarray  # [W] unit index of each row in the full word-level maps


def word_block(wm: WordMaps, n_words: int | None = None) -> WordBlock:
    sel = np.flatnonzero(wm.unit_special == SPECIAL_NONE)
    word = wm.unit_word[sel]
    n = int(word.max()) + 1 if n_words is None else n_words
    position = np.full(n, -1, dtype=np.int64)
    keep = word < n
    sel, word = sel[keep], word[keep]
    position[word] = np.arange(len(word))
    return WordBlock(wm.maps[:, sel][:, :, sel], word, position, sel)


def word_level(maps: np.ndarray, word: np.ndarray, special: np.ndarray, mode: str = "mean"):
    """Clark's token-to-word aggregation (:func:`headatlas.core.store.word_level`) in float32."""
    return store_word_level(maps.astype(np.float32, copy=False), word, special, mode)


def iter_word_maps(
    store: AttentionStore,
    mode: str = "mean",
    chunk: int = 32,
    ks: Sequence[int] | None = None,
    max_bytes: int = 256 << 20,
) -> Iterator[WordMaps]:
    """Word-level maps of every head, sequence by sequence (store order, or the runs of ``ks``).

    Each sequence's [L*H, n, n] maps are aggregated at once (:func:`word_level`); sequences
    are read at most ``chunk`` at a time and at most ``max_bytes`` of maps (all layers) at a
    time, one read per layer.
    """
    ks = np.arange(len(store)) if ks is None else np.asarray(ks, dtype=np.int64)
    L, H = store.n_layers, store.n_heads
    for start in range(0, len(ks), chunk):
        part = ks[start : start + chunk]
        contiguous = np.split(part, np.flatnonzero(np.diff(part) != 1) + 1)
        sizes = [L * H * 4 * store.lengths[c] ** 2 for c in contiguous]
        runs = [c[a:b] for c, size in zip(contiguous, sizes) for a, b in budget_runs(size, max_bytes)]
        for run in runs:
            per_layer = [store.layer_maps(layer, int(run[0]), int(run[-1]) + 1) for layer in range(L)]
            for i, k in enumerate(run):
                t = store.tokens(int(k))
                n = int(store.lengths[k])
                stacked = np.stack([per_layer[layer][i] for layer in range(L)]).reshape(L * H, n, n)
                maps, unit_word, unit_special = word_level(stacked, t["word"], t["special"], mode)
                yield WordMaps(int(k), maps, unit_word, unit_special)


def head_predictions(maps: np.ndarray) -> np.ndarray:
    """[2, K, W] predicted rows (-1 = none) of [K, W, W] word maps, self excluded:
    [0] dep->head (argmax over row d), [1] head->dep (argmax over column d)."""
    k, w, _ = maps.shape
    eye = np.eye(w, dtype=bool)
    out = np.full((2, k, w), -1, dtype=np.int64)
    for i, m in enumerate((maps, maps.transpose(0, 2, 1))):
        s = np.where(eye, -np.inf, m)
        if w > 1:
            best = s.argmax(-1)
            ok = np.take_along_axis(s, best[..., None], -1)[..., 0] > 0
            out[i] = np.where(ok, best, -1)
    return out


def offset_predictions(n: int, offsets: Sequence[int]) -> np.ndarray:
    """[len(offsets), n] predicted head word of each word; -2 (nothing) outside the sentence."""
    pos = np.arange(n)[None, :] + np.asarray(offsets)[:, None]
    return np.where((pos >= 0) & (pos < n), pos, -2)


def apply_poss_rule(pred: np.ndarray, record: Record, block: WordBlock, poss_relations=POSS_RELATIONS) -> np.ndarray:
    """Clark's possessive rule: a nmod:poss dependent followed by 's takes the 's word's prediction."""
    n = len(block.position)
    nxt = block.word + 1
    has_next = nxt < n
    nxt_row = np.where(has_next, block.position[np.minimum(nxt, n - 1)], -1)
    marker = np.array(
        [has_next[i] and record.words[d + 1].lower() in POSS_MARKERS for i, d in enumerate(block.word)], dtype=bool
    )
    poss = np.isin(np.asarray(record.deprel)[block.word], poss_relations)
    rows = np.flatnonzero(poss & marker & (nxt_row >= 0))
    pred = pred.copy()
    pred[..., rows] = pred[..., nxt_row[rows]]
    return pred


@dataclass
class Correctness:
    """Per dependent (a word with pieces): relation, sentence, correctness of every head in
    both directions ([D, 2, K]) and of every offset baseline ([D, n_offsets])."""

    relation: np.ndarray
    sentence: np.ndarray
    heads: np.ndarray
    offsets: np.ndarray
    offset_values: tuple[int, ...]
    n_layers: int
    n_heads: int
    n_missing: int = 0  # words without pieces (not evaluated)


def sentence_correctness(wm: WordMaps, record: Record, n_words: int, offsets: Sequence[int], poss_rule: bool = True):
    """(relations [W], head correctness [W, 2, K], offset correctness [W, n_offsets]) of one sentence."""
    block = word_block(wm, n_words)
    return block_correctness(head_predictions(block.maps), block, record, n_words, offsets, poss_rule)


def block_correctness(
    pred: np.ndarray, block: WordBlock, record: Record, n_words: int, offsets: Sequence[int], poss_rule: bool = True
):
    """:func:`sentence_correctness` from the heads' predictions ([2, K, W] word rows of ``block``, -1 = none;
    the block's maps are not read)."""
    gold = np.asarray(record.head[:n_words])
    gold = np.where(gold >= n_words, -2, gold)  # a head past the kept words is never predicted
    gold_row = np.where(gold >= 0, block.position[np.clip(gold, 0, None)], -2)
    gold_row = np.where(gold_row < 0, -2, gold_row)  # ROOT, or a head without pieces: never right
    if poss_rule:
        pred = apply_poss_rule(pred, record, block)
    dep = block.word
    heads = (pred == gold_row[dep][None, None, :]).transpose(2, 0, 1)
    base = offset_predictions(n_words, offsets)[:, dep] == gold[dep][None, :]
    return np.asarray(record.deprel)[dep], heads, base.T


def collect_correctness(
    items: Iterable[tuple[WordMaps, Record, int]],
    n_layers: int,
    n_heads: int,
    offsets=DEFAULT_OFFSETS,
    poss_rule: bool = True,
) -> Correctness:
    """Gather per-dependent correctness over (word maps, record, words kept) triples."""
    blocks = ((word_block(wm, n_words), record, n_words) for wm, record, n_words in items)
    return gather_correctness(
        ((head_predictions(b.maps), b, record, n) for b, record, n in blocks), n_layers, n_heads, offsets, poss_rule
    )


def gather_correctness(
    items: Iterable[tuple[np.ndarray, WordBlock, Record, int]],
    n_layers: int,
    n_heads: int,
    offsets=DEFAULT_OFFSETS,
    poss_rule: bool = True,
) -> Correctness:
    """Gather per-dependent correctness over (predictions [2, K, W], word block, record, words kept)
    (:func:`block_correctness`): from maps (:func:`collect_correctness`) or from reduced predictions."""
    rel, sent, heads, base = [], [], [], []
    missing = 0
    for s, (pred, block, record, n_words) in enumerate(items):
        if not record.head:
            raise ValueError(f"record {record.id!r} has no dependency heads; Table 1 needs a conllu corpus")
        r, h, b = block_correctness(pred, block, record, n_words, offsets, poss_rule)
        missing += n_words - len(r)
        rel.append(r)
        sent.append(np.full(len(r), s))
        heads.append(h)
        base.append(b)
    if not rel:
        raise ValueError("no sentence to evaluate")
    return Correctness(
        np.concatenate(rel),
        np.concatenate(sent),
        np.concatenate(heads),
        np.concatenate(base),
        tuple(offsets),
        n_layers,
        n_heads,
        missing,
    )


@dataclass(frozen=True, kw_only=True)
class HeadSettings(Settings):
    """The keys of analysis.clark_syntax (workflow/schemas/clark_syntax.schema.yaml) rule clark_syntax_heads reads."""

    SECTION = "analysis.clark_syntax"

    word_mode: str = "mean"
    min_count: int = 100
    offsets: tuple[int, ...] = DEFAULT_OFFSETS
    bootstrap: int = 1000
    seed: int = 0
    poss_rule: bool = True


def relation_masks(c: Correctness, min_count: int, also: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """ "All" and every relation (except root, never predicted) with at least ``min_count``
    dependents, most frequent first; relations in ``also`` are added when present at all."""
    names, counts = np.unique(c.relation, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    out = {ALL: np.ones(len(c.relation), dtype=bool)}
    for i in order:
        if (counts[i] >= min_count or names[i] in also) and names[i] != "root":
            out[str(names[i])] = c.relation == names[i]
    return out


def head_table(c: Correctness, masks: dict[str, np.ndarray], model: str) -> pd.DataFrame:
    """Tidy per-head accuracies: one row per (layer, head, relation, direction)."""
    frames = []
    layer, head = np.divmod(np.arange(c.n_layers * c.n_heads), c.n_heads)
    for name, m in masks.items():
        acc = c.heads[m].mean(0)  # [2, K]
        for d, direction in enumerate(DIRECTIONS):
            frames.append(
                pd.DataFrame(
                    {
                        "model": model,
                        "layer": layer,
                        "head": head,
                        "relation": name,
                        "direction": direction,
                        "n": int(m.sum()),
                        "accuracy": acc[d],
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def baseline_table(c: Correctness, masks: dict[str, np.ndarray], model: str) -> pd.DataFrame:
    rows = []
    for name, m in masks.items():
        acc = c.offsets[m].mean(0)
        for k, a in zip(c.offset_values, acc):
            rows.append({"model": model, "relation": name, "offset": k, "n": int(m.sum()), "accuracy": a})
    return pd.DataFrame(rows)


def sentence_ci(
    correct: np.ndarray, cluster: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of the accuracy ``correct`` resampling whole clusters (sentences, documents)."""
    lo, hi = bootstrap_ci(correct, n_boot=n_boot, level=level, rng=np.random.default_rng(seed), clusters=cluster)
    return float(lo[0]), float(hi[0])


def relation_seed(seed: int, relation: str) -> int:
    return seed * 1_000_003 + zlib.crc32(relation.encode())


def best_table(
    c: Correctness, masks: dict[str, np.ndarray], model: str, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Per relation: the best head and direction (ties: lower layer, head, dep->head first)
    with a sentence-bootstrap CI, and the best offset baseline."""
    rows = []
    for name, m in masks.items():
        acc = c.heads[m].mean(0)  # [2, K]
        flat = acc.T.reshape(-1)  # head-major: (k, direction)
        best = int(np.argmax(flat))
        k, d = divmod(best, 2)
        layer, head = divmod(k, c.n_heads)
        lo, hi = sentence_ci(c.heads[m][:, d, k], c.sentence[m], n_boot, relation_seed(seed, name))
        base = c.offsets[m].mean(0)
        b = int(np.argmax(base))
        rows.append(
            {
                "model": model,
                "relation": name,
                "n": int(m.sum()),
                "layer": layer,
                "head": head,
                "label": head_label(layer, head),
                "direction": DIRECTIONS[d],
                "accuracy": float(acc[d, k]),
                "ci_low": lo,
                "ci_high": hi,
                "baseline_offset": c.offset_values[b],
                "baseline_accuracy": float(base[b]),
            }
        )
    return pd.DataFrame(rows)


def table1(best: pd.DataFrame, min_count: int = 0) -> pd.DataFrame:
    """Clark's Table 1 rows (through :data:`RELATION_MAP`) beside the paper's numbers; a UD
    relation absent from ``best`` gets n = 0, one rarer than ``min_count`` is flagged."""
    t = RELATION_MAP.merge(PAPER_TABLE1, on="paper_relation", how="left")
    t = t.merge(best, on="relation", how="left")
    t["model"] = t["model"].fillna(best["model"].iloc[0] if len(best) else "")
    t["n"] = t["n"].fillna(0).astype(int)
    t["below_min_count"] = (t["n"] < min_count) & (t["relation"] != ALL)
    cols = [
        "model",
        "paper_relation",
        "relation",
        "correspondence",
        "n",
        "below_min_count",
        "layer",
        "head",
        "label",
        "direction",
        "accuracy",
        "ci_low",
        "ci_high",
        "baseline_offset",
        "baseline_accuracy",
        "paper_head",
        "paper_accuracy",
        "paper_baseline",
        "paper_offset",
        "note",
    ]
    for col in ("layer", "head", "baseline_offset"):
        t[col] = t[col].astype("Int64")
    return t[cols]


def syntax_tables(c: Correctness, model: str, settings: HeadSettings = HeadSettings()) -> dict[str, pd.DataFrame]:
    """Every table of rule clark_syntax_heads: per-head accuracies and offset baselines of the
    relations with ``settings.min_count`` dependents, their best heads, and Table 1 (which also shows
    its rarer relations)."""
    min_count = settings.min_count
    masks = relation_masks(c, min_count)
    also = list(RELATION_MAP["relation"])
    best = best_table(c, relation_masks(c, min_count, also=also), model, settings.bootstrap, settings.seed)
    return {
        "heads": head_table(c, masks, model),
        "baselines": baseline_table(c, masks, model),
        "relations": best[best["relation"].isin(list(masks))],
        "table1": table1(best, min_count),
    }
