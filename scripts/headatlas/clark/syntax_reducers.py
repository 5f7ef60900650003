"""Clark et al.'s syntax side (Tables 1-3) as reducers (:mod:`headatlas.core.reduce`): what
:mod:`headatlas.clark.syntax`, :mod:`headatlas.clark.coref` and :mod:`headatlas.clark.parsing_probe` need
from every head's attention, read per layer through its :class:`~headatlas.core.layer_view.LayerView` (maps or
map-free), so that a corpus need not store every n x n map.

Every reducer first takes Clark's word-level maps of the layer (:func:`view_word_maps`: the same aggregation
as :func:`headatlas.core.store.word_level`, F (A M) with M the key piece -> unit indicator, the :data:`UNITS`
value columns of the view; cached on the batch and shared by the reducers of one layer), then:

- :class:`HeadPredictionReducer` (Table 1): per head and word, the most-attended other word in both
  directions (``dep->head`` argmax over the word's row, ``head->dep`` over its column), as
  :func:`headatlas.clark.syntax.head_predictions`; exact ties (two or more words share a positive maximum;
  the first wins, as numpy's argmax) are counted per head and direction;
- :class:`CorefReducer` (Table 2): per anaphor and head, the candidate head word the anaphor's head word
  attends to most, as :func:`headatlas.clark.coref.attention_correct` (ties counted per head);
- :class:`WordMapsReducer` (Table 3): every head's word-level maps themselves (words and special tokens),
  smaller than the piece-level store; :class:`WordMapSet` hands them to the probes as
  :class:`~headatlas.clark.syntax.WordMaps`.

The coreference reducer needs only its anaphors' head-word rows (:func:`anaphor_rows`,
:meth:`~headatlas.core.layer_view.LayerView.query_rows`; map-free: recomputed from q, k and LSE for those pieces),
as long documents would need a column per word.

Results hold one entry per sequence in feed order (record_index, n_words), so that shards concatenate
(``combine``) and an analysis joins them with the corpus records without a store. The rules of Tables 1 and 2,
:func:`run_heads` and :func:`run_coref`, live here too: they reduce (:func:`headatlas.core.reduce.reduce_corpus`),
then score with :mod:`~headatlas.clark.syntax` and :mod:`~headatlas.clark.coref`, which import no reducer.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import MISSING, dataclass, field, fields
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_NONE, Record
from ..core.reduce import reduce_corpus
from ..core.reducer import Needs, ReduceBatch, Reducer
from ..core.store import decode_cells, encode_cells, lower_cells, unit_pooling, word_units
from .coref import Anaphors, CorefResult, CorefSettings, baseline_correct, coref_tables, document_anaphors
from .syntax import Correctness, HeadSettings, WordBlock, WordMaps, gather_correctness, syntax_tables

log = logging.getLogger("headatlas.clark.syntax_reducers")

ANALYSIS = "clark_syntax"
WORD_MODES = ("mean", "first")


# --- word-level maps of a padded batch -------------------------------------------------------------------


@dataclass(frozen=True)
class BatchUnits:
    """The units (words and special tokens, :func:`~headatlas.core.store.word_units`) of a padded batch."""

    frm: np.ndarray  # [B, U, n] float32: unit row = this combination of token rows (mean or first piece)
    to: np.ndarray  # [B, n, U] float32: token column -> its unit's column (sum)
    n_units: np.ndarray  # [B]
    unit_word: np.ndarray  # [B, U] record word of each unit, -1 for specials and padding
    unit_special: np.ndarray  # [B, U] special kind, -2 for padding
    word_unit: np.ndarray  # [B, W] unit of each word row (the words < n_words with pieces), 0 for padding
    n_rows: np.ndarray  # [B] word rows per sequence
    _cache: dict = field(default_factory=dict, repr=False, compare=False)  # device copies (:func:`_on`)

    @property
    def word_valid(self) -> np.ndarray:
        return np.arange(self.word_unit.shape[1])[None, :] < self.n_rows[:, None]


def batch_units(batch: ReduceBatch, mode: str) -> BatchUnits:
    """Units of every sequence of ``batch`` (cached on the batch); the aggregation matrices are built as
    :func:`headatlas.core.store.word_level` builds them, in float32."""
    if mode not in WORD_MODES:
        raise ValueError(f"word_mode must be one of {WORD_MODES}, not {mode!r}")
    key = ("clark_units", mode)
    if batch.recall(key) is not None:
        return batch.recall(key)
    per = []
    for b in range(len(batch)):  # per sequence: its own units (token tables, not attention cells)
        m = int(batch.lengths[b])
        unit, uw, us = word_units(batch.word[b, :m], batch.special[b, :m])
        per.append((unit, uw, us))
    bsz, n = len(batch), batch.n
    u_max = max([len(p[1]) for p in per], default=0)
    frm = np.zeros((bsz, u_max, n), dtype=np.float32)
    to = np.zeros((bsz, n, u_max), dtype=np.float32)
    unit_word = np.full((bsz, u_max), -1, dtype=np.int64)
    unit_special = np.full((bsz, u_max), -2, dtype=np.int64)
    rows = []
    for b, (unit, uw, us) in enumerate(per):
        m, u = len(unit), len(uw)
        f, t = unit_pooling(unit, u, mode, np.float32)
        frm[b, :u, :m] = f
        to[b, :m, :u] = t
        unit_word[b, :u] = uw
        unit_special[b, :u] = us
        rows.append(np.flatnonzero((us == SPECIAL_NONE) & (uw < int(batch.n_words[b]))))
    w_max = max([len(r) for r in rows], default=0)
    word_unit = np.zeros((bsz, w_max), dtype=np.int64)
    for b, r in enumerate(rows):
        word_unit[b, : len(r)] = r
    out = BatchUnits(
        frm,
        to,
        np.array([len(p[1]) for p in per], dtype=np.int64),
        unit_word,
        unit_special,
        word_unit,
        np.array([len(r) for r in rows], dtype=np.int64),
    )
    batch.keep(key, out)
    return out


def _on(owner, name: str, array: np.ndarray, device):
    """``array`` as a tensor on ``device``, cached on ``owner`` (a batch or its units)."""
    import torch

    key = ("clark_t", name, str(device))
    if key not in owner._cache:
        owner._cache[key] = torch.as_tensor(array, device=device)
    return owner._cache[key]


UNITS = "clark:units"  # the value columns of the key pieces' units (units.to: the same in every word mode)


def view_word_maps(view, batch: ReduceBatch, mode: str):
    """[B, H, U, U] float32 word-level maps of one layer (units of :func:`batch_units`; padded units are 0), the
    same aggregation as :func:`headatlas.core.store.word_level`: the key side A.M (M = ``units.to``, the piece ->
    unit indicator) is the :data:`UNITS` value columns of the layer view, the query side the ``frm`` product.
    Cached on the batch for the view it was made from (shared by the reducers of one layer); read-only."""
    hit = batch.recall(("clark_word_maps", mode))
    if hit is not None and hit[0]() is view:
        return hit[1]
    units = batch_units(batch, mode)
    am = view.value(UNITS)  # [B, H, n, U]
    w = _on(units, "frm", units.frm, am.device)[:, None] @ am
    batch.keep(("clark_word_maps", mode), (weakref.ref(view), w))
    return w


def word_predictions(w, units: BatchUnits):
    """(pred [2, B, H, W] int64 word row or -1, tied [2, B, H, W] bool) of word-level maps ``w``
    [B, H, U, U] restricted to the word rows: :func:`headatlas.clark.syntax.head_predictions` for every
    sequence at once, self and padding excluded; ``tied``: two or more rows share a positive maximum."""
    import torch

    dev = w.device
    idx = _on(units, "word_unit", units.word_unit, dev)  # [B, W]
    valid = _on(units, "word_valid", units.word_valid, dev)
    bsz, h, u, _ = w.shape
    nw = idx.shape[1]
    rows = w.gather(2, idx[:, None, :, None].expand(bsz, h, nw, u))  # [B, H, W, U]
    m = rows.gather(3, idx[:, None, None, :].expand(bsz, h, nw, nw))  # [B, H, W, W]
    eye = torch.eye(nw, dtype=torch.bool, device=dev)
    allowed = (valid[:, :, None] & valid[:, None, :] & ~eye)[:, None]  # [B, 1, W, W]
    s = torch.where(allowed, m, -torch.inf)  # allowed is symmetric: the other direction is s transposed
    preds, tied = [], []
    for dim in (-1, -2):  # over a row's keys, then over a column's queries (no transposed copy)
        best, arg = s.max(dim)  # arg: the first maximum, as numpy's argmax
        ok = best > 0
        preds.append(torch.where(ok, arg, -1))
        tied.append(ok & ((s == best.unsqueeze(dim)).sum(dim) > 1))
    return torch.stack(preds), torch.stack(tied)


# --- results -----------------------------------------------------------------------------------------------


class _Arrays:
    """A result made of named numpy arrays: to/from arrays and concatenation over sequences."""

    @classmethod
    def from_arrays(cls, arrays: dict):
        kw = {}
        for f in fields(cls):
            if f.name not in arrays and f.default is not MISSING:  # a field added later, e.g. WordMapSet.lower
                kw[f.name] = f.default
                continue
            a = np.asarray(arrays[f.name])
            kw[f.name] = int(a) if a.ndim == 0 else a
        return cls(**kw)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {f.name: np.asarray(getattr(self, f.name)) for f in fields(self)}

    @property
    def n_sequences(self) -> int:
        return len(self.record_index)

    def __len__(self) -> int:
        return self.n_sequences


def _offsets(counts) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])


def _check_heads(parts: Sequence, name: str) -> None:
    shapes = {(p.n_layers, p.n_heads) for p in parts}
    if len(shapes) != 1:
        raise ValueError(f"{name}: shards of different models (layers, heads) {sorted(shapes)}")


@dataclass(frozen=True)
class HeadPredictions(_Arrays):
    """Table 1's input: per sequence (feed order), the word rows (words < n_words with pieces) and every
    head's prediction for each of them in both directions (a word row, -1 = none)."""

    record_index: np.ndarray  # [N]
    n_words: np.ndarray  # [N]
    row_offset: np.ndarray  # [N + 1] into the word-row axis
    word: np.ndarray  # [R] record word of each word row
    pred: np.ndarray  # [2, L*H, R] int16 word row within its sequence, -1 = none
    ties: np.ndarray  # [2, L*H] predictions with an exact tie
    n_layers: int
    n_heads: int

    def sentence(self, i: int) -> tuple[np.ndarray, WordBlock]:
        """(pred [2, K, W] int64, the word block without maps) of the i-th sequence."""
        a, b = self.row_offset[i], self.row_offset[i + 1]
        word = self.word[a:b]
        position = np.full(int(self.n_words[i]), -1, dtype=np.int64)
        position[word] = np.arange(len(word))
        return self.pred[:, :, a:b].astype(np.int64), WordBlock(None, word, position, None)

    def correctness(self, records: Sequence[Record], offsets, poss_rule: bool = True) -> Correctness:
        """:class:`~headatlas.clark.syntax.Correctness` of every head and offset baseline."""
        items = (
            (*self.sentence(i), records[int(self.record_index[i])], int(self.n_words[i]))
            for i in range(self.n_sequences)
        )
        return gather_correctness(items, self.n_layers, self.n_heads, offsets, poss_rule)

    @classmethod
    def combine(cls, parts: Sequence["HeadPredictions"]) -> "HeadPredictions":
        _check_heads(parts, "clark_syntax_heads")
        return cls(
            np.concatenate([p.record_index for p in parts]),
            np.concatenate([p.n_words for p in parts]),
            _offsets(np.concatenate([np.diff(p.row_offset) for p in parts])),
            np.concatenate([p.word for p in parts]),
            np.concatenate([p.pred for p in parts], axis=2),
            np.sum([p.ties for p in parts], axis=0),
            parts[0].n_layers,
            parts[0].n_heads,
        )


@dataclass(frozen=True)
class CorefPredictions(_Arrays):
    """Table 2's input: per anaphor (documents in feed order, anaphors as
    :func:`~headatlas.clark.coref.document_anaphors` lists them), every head's predicted candidate head word
    (record word, -1 = none)."""

    record_index: np.ndarray  # [N]
    n_words: np.ndarray  # [N]
    anaphor_offset: np.ndarray  # [N + 1] into the anaphor axis
    head: np.ndarray  # [A] the anaphor's head word
    has_pieces: np.ndarray  # [A] bool: its head word has pieces (else every head is wrong)
    pred: np.ndarray  # [L*H, A] int16
    ties: np.ndarray  # [L*H] predictions with an exact tie
    n_layers: int
    n_heads: int

    @classmethod
    def combine(cls, parts: Sequence["CorefPredictions"]) -> "CorefPredictions":
        _check_heads(parts, "clark_syntax_coref")
        return cls(
            np.concatenate([p.record_index for p in parts]),
            np.concatenate([p.n_words for p in parts]),
            _offsets(np.concatenate([np.diff(p.anaphor_offset) for p in parts])),
            np.concatenate([p.head for p in parts]),
            np.concatenate([p.has_pieces for p in parts]),
            np.concatenate([p.pred for p in parts], axis=1),
            np.sum([p.ties for p in parts], axis=0),
            parts[0].n_layers,
            parts[0].n_heads,
        )


def coref_result(splits: dict[str, tuple["CorefPredictions", Sequence[Record]]]) -> CorefResult:
    """:class:`~headatlas.clark.coref.CorefResult` (what :func:`headatlas.clark.coref.collect` computes from
    the maps) from the predictions of each split (split -> (predictions, records)), splits in order."""
    an = Anaphors([], [], [], [], [], [], [])
    heads, missing = [], 0
    first = next(iter(splits.values()))[0]
    for split, (p, records) in splits.items():
        _check_heads([first, p], "clark_syntax_coref")
        for i in range(p.n_sequences):
            idx = document_anaphors(records[int(p.record_index[i])], int(p.n_words[i]), split, an)
            a, b = p.anaphor_offset[i], p.anaphor_offset[i + 1]
            if len(idx) != b - a or any(an.head[j] != h for j, h in zip(idx, p.head[a:b])):
                raise ValueError(
                    f"clark_syntax_coref: the anaphors of record {records[int(p.record_index[i])].id!r} ({split}) differ "
                    "from the reduced ones; rerun the extraction of that corpus"
                )
            for j, k in zip(idx, range(a, b)):
                pred = p.pred[:, k].astype(np.int64)  # [K]
                cands, right = an.candidates[j], an.right[j]
                pos = np.searchsorted(cands, pred)
                hit = (pred >= 0) & (pos < len(cands)) & (cands[np.minimum(pos, len(cands) - 1)] == pred)
                heads.append(hit & right[np.minimum(pos, len(cands) - 1)] & bool(p.has_pieces[k]))
            missing += int((~p.has_pieces[a:b]).sum())
    if not heads:
        raise ValueError("no mention with an antecedent in any document")
    return CorefResult(an, np.stack(heads), baseline_correct(an), first.n_layers, first.n_heads, missing)


@dataclass(frozen=True)
class WordMapSet(_Arrays):
    """Every head's word-level maps of every sequence (feed order): sequence i's [L*H, U, U] float32 maps
    over its units (words and special tokens, :func:`headatlas.core.store.word_level`'s), flattened. With
    ``lower`` (a causal model: no word attends to a later one) only each map's lower triangle is kept, row
    by row, as the store keeps a decoder's maps (:func:`~headatlas.core.store.encode_cells`); :meth:`word_maps`
    unpacks it."""

    record_index: np.ndarray  # [N]
    n_words: np.ndarray  # [N]
    unit_offset: np.ndarray  # [N + 1] into the unit axis
    unit_word: np.ndarray  # [sum U]
    unit_special: np.ndarray  # [sum U]
    map_offset: np.ndarray  # [N + 1] into ``maps``
    maps: np.ndarray  # [sum L*H*U*U] float32, or [sum L*H*U*(U+1)/2] with ``lower``
    n_layers: int
    n_heads: int
    lower: int = 0

    def word_maps(self, i: int) -> WordMaps:
        a, b = self.unit_offset[i], self.unit_offset[i + 1]
        u = int(b - a)
        flat = self.maps[self.map_offset[i] : self.map_offset[i + 1]].reshape(self.n_layers * self.n_heads, -1)
        maps = decode_cells(flat, np.array([u]), "lower" if self.lower else "full").reshape(-1, u, u)
        return WordMaps(i, maps, self.unit_word[a:b], self.unit_special[a:b])

    def iter_word_maps(self, ks=None) -> Iterator[WordMaps]:
        """As :func:`headatlas.clark.syntax.iter_word_maps` (the sequence index ``k`` = feed order)."""
        for k in range(self.n_sequences) if ks is None else ks:
            yield self.word_maps(int(k))

    @property
    def nbytes(self) -> int:
        return sum(np.asarray(getattr(self, f.name)).nbytes for f in fields(self))

    @classmethod
    def combine(cls, parts: Sequence["WordMapSet"]) -> "WordMapSet":
        _check_heads(parts, "clark_syntax_word_maps")
        if len({int(p.lower) for p in parts}) != 1:
            raise ValueError("clark_syntax_word_maps: shards with and without lower-triangle maps")
        return cls(
            np.concatenate([p.record_index for p in parts]),
            np.concatenate([p.n_words for p in parts]),
            _offsets(np.concatenate([np.diff(p.unit_offset) for p in parts])),
            np.concatenate([p.unit_word for p in parts]),
            np.concatenate([p.unit_special for p in parts]),
            _offsets(np.concatenate([np.diff(p.map_offset) for p in parts])),
            np.concatenate([p.maps for p in parts]),
            parts[0].n_layers,
            parts[0].n_heads,
            int(parts[0].lower),
        )


# --- reducers ----------------------------------------------------------------------------------------------


class _WordReducer(Reducer):
    """Shared parts: the word mode, per-sequence bookkeeping (layer 0 of a batch), device results kept
    until ``flush_every`` (batch, layer) results are pending, then copied to the host at once."""

    analysis = ANALYSIS
    result_type: type = _Arrays

    def __init__(self, word_mode: str = "mean", flush_every: int = 64):
        if word_mode not in WORD_MODES:
            raise ValueError(f"analysis.clark_syntax.word_mode must be one of {WORD_MODES}, not {word_mode!r}")
        self.word_mode = word_mode
        self.flush_every = flush_every

    def params(self) -> dict:
        return {"word_mode": self.word_mode}

    def to_arrays(self, result) -> dict[str, np.ndarray]:
        return result.to_arrays()

    @classmethod
    def from_arrays(cls, arrays: dict):
        return cls.result_type.from_arrays(arrays)

    @classmethod
    def combine(cls, parts: list):
        if not parts:
            raise ValueError(f"{cls.name}: no shard to combine")
        return cls.result_type.combine(parts)

    def start(self, info) -> None:
        super().start(info)
        self.k = info.n_layers * info.n_heads
        self.record_index = np.full(info.n_sequences, -1, dtype=np.int64)
        self.n_words = np.zeros(info.n_sequences, dtype=np.int64)
        self.per_seq: dict[int, tuple] = {}  # feed index -> the sequence's arrays (filled layer by layer)
        self._pending: list = []

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        """The word-level maps' key side: the :data:`UNITS` value columns (one per unit of the widest
        sequence), shared by the reducers of a corpus (:class:`CorefReducer` needs none)."""
        return Needs(values={UNITS: batch_units(batch, self.word_mode).to})

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        units = self._units(layer, batch)
        self._add(layer, batch, self._reduce_view(view, batch, units))

    def _reduce_view(self, view, batch, units):
        """The layer's result from its view: :meth:`_reduce` of the word-level maps (:func:`view_word_maps`)."""
        return self._reduce(view_word_maps(view, batch, self.word_mode), batch, units)

    def _units(self, layer: int, batch: ReduceBatch) -> BatchUnits:
        units = batch_units(batch, self.word_mode)
        if layer == 0:
            self.record_index[batch.seq] = batch.record_index
            self.n_words[batch.seq] = batch.n_words
            for b, s in enumerate(batch.seq):
                self.per_seq[int(s)] = self._new(b, batch, units)
        return units

    def _add(self, layer: int, batch: ReduceBatch, out) -> None:
        self._pending.append((layer, batch.seq, out))  # not the batch: its maps
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        for layer, seq, out in self._pending:
            host = [x.cpu().numpy() for x in out]
            h = self.info.n_heads
            for b, s in enumerate(seq):
                self._store(self.per_seq[int(s)], slice(layer * h, (layer + 1) * h), b, host)
        self._pending = []

    def _sequences(self) -> list[tuple]:
        self._flush()
        missing = [s for s in range(self.info.n_sequences) if s not in self.per_seq]
        if missing:
            raise ValueError(f"{self.name}: {len(missing)} sequences were never reduced (first: {missing[:5]})")
        return [self.per_seq[s] for s in range(self.info.n_sequences)]


class HeadPredictionReducer(_WordReducer):
    """Clark's Table 1 input: every head's word-level argmax in both directions (:class:`HeadPredictions`)."""

    name = "clark_syntax_heads"
    analysis = "clark_syntax"
    result_type = HeadPredictions

    def start(self, info) -> None:
        super().start(info)
        self.ties = np.zeros((2, self.k), dtype=np.int64)

    def _new(self, b, batch, units):
        r = int(units.n_rows[b])
        return units.unit_word[b, units.word_unit[b, :r]], np.full((2, self.k, r), -1, dtype=np.int16)

    def _reduce(self, w, batch, units):
        return word_predictions(w, units)

    def _store(self, seq, heads, b, host) -> None:
        word, pred = seq
        r = len(word)
        pred[:, heads] = host[0][:, b, :, :r]
        self.ties[:, heads] += host[1][:, b, :, :r].sum(-1)

    def result(self) -> HeadPredictions:
        seqs = self._sequences()
        return HeadPredictions(
            self.record_index,
            self.n_words,
            _offsets([len(w) for w, _ in seqs]),
            np.concatenate([w for w, _ in seqs]) if seqs else np.zeros(0, dtype=np.int64),
            np.concatenate([p for _, p in seqs], axis=2) if seqs else np.zeros((2, self.k, 0), dtype=np.int16),
            self.ties,
            self.info.n_layers,
            self.info.n_heads,
        )


@dataclass(frozen=True)
class _BatchAnaphors:
    """The anaphors of a batch's documents (:func:`~headatlas.clark.coref.document_anaphors`)."""

    seq: np.ndarray  # [A] batch row of each anaphor's document
    head: np.ndarray  # [A] record word of its head
    head_unit: np.ndarray  # [A] unit of its head word, -1 without pieces
    candidates: np.ndarray  # [A, U] bool: units of its candidates' head words
    per_row: list  # [B] anaphor indices of each batch row


def batch_anaphors(batch: ReduceBatch, units: BatchUnits) -> _BatchAnaphors:
    key = ("clark_anaphors", id(units))
    if batch.recall(key) is not None:
        return batch.recall(key)
    if batch.records is None:
        raise ValueError("clark_syntax_coref needs the corpus records (mentions and trees) in the feed")
    an = Anaphors([], [], [], [], [], [], [])
    seq, per_row = [], []
    for b, record in enumerate(batch.records):
        idx = document_anaphors(record, int(batch.n_words[b]), "", an)
        seq += [b] * len(idx)
        per_row.append(idx)
    a, u = len(an.head), units.unit_word.shape[1]
    head_unit = np.full(a, -1, dtype=np.int64)
    cand = np.zeros((a, u), dtype=bool)
    for i in range(a):  # per anaphor: a lookup of a few words
        row = units.unit_word[seq[i]]
        words = row[units.word_unit[seq[i], : units.n_rows[seq[i]]]]
        unit_of = dict(zip(words.tolist(), units.word_unit[seq[i], : units.n_rows[seq[i]]].tolist()))
        head_unit[i] = unit_of.get(an.head[i], -1)
        cand[i, [unit_of[w] for w in an.candidates[i].tolist() if w in unit_of]] = True
    out = _BatchAnaphors(np.asarray(seq, dtype=np.int64), np.asarray(an.head, dtype=np.int64), head_unit, cand, per_row)
    batch.keep(key, out)
    return out


def _no_anaphors(h: int):
    import torch

    return torch.zeros((h, 0), dtype=torch.int64), torch.zeros((h, 0), dtype=torch.bool)


@dataclass(frozen=True)
class _AnaphorPieces:
    """The query pieces of a batch's anaphor head words (:func:`anaphor_rows`)."""

    query: np.ndarray  # [B, P] token of each slot, -1 for padding
    weight: np.ndarray  # [B, P] float32 its weight in the head word's row (units.frm)
    anaphor: np.ndarray  # [B, P] its anaphor (index in _BatchAnaphors), A for padding
    key_unit: np.ndarray  # [B, n] unit of each key token (0 for padding: its cells are 0)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)


def anaphor_pieces(batch: ReduceBatch, units: BatchUnits, an: _BatchAnaphors) -> _AnaphorPieces:
    key = ("clark_anaphor_pieces", id(units))
    if batch.recall(key) is not None:
        return batch.recall(key)
    bsz, n = len(batch), batch.n
    per = [[] for _ in range(bsz)]  # per sequence: (token, weight, anaphor) of each head word's pieces
    for a, (b, hu) in enumerate(zip(an.seq.tolist(), an.head_unit.tolist())):  # per anaphor: its few pieces
        if hu >= 0:
            tok = np.flatnonzero(units.frm[b, hu])
            per[b] += [(t, units.frm[b, hu, t], a) for t in tok.tolist()]
    p = max([len(x) for x in per], default=0)
    query = np.full((bsz, p), -1, dtype=np.int64)
    weight = np.zeros((bsz, p), dtype=np.float32)
    anaphor = np.full((bsz, p), len(an.seq), dtype=np.int64)
    for b, x in enumerate(per):
        if x:
            query[b, : len(x)], weight[b, : len(x)], anaphor[b, : len(x)] = zip(*x)
    key_unit = np.where(units.to.any(-1), units.to.argmax(-1), 0) if n else np.zeros((bsz, 0), dtype=np.int64)
    out = _AnaphorPieces(query, weight, anaphor, key_unit.astype(np.int64))
    batch.keep(key, out)
    return out


def anaphor_rows(view, batch: ReduceBatch, units: BatchUnits, an: _BatchAnaphors):
    """[A, H, U] each anaphor's head-word row of the word-level maps (0 without pieces): the rows of the head
    words' pieces (:meth:`~headatlas.core.layer_view.LayerView.query_rows`; map-free one dot product per piece and
    key), summed into key units and pooled over each head word's pieces with the ``frm`` weights (mean or
    first)."""
    import torch

    qp = anaphor_pieces(batch, units, an)
    dev = view.device
    rows = view.query_rows(qp.query)  # [B, H, P, n]
    bsz, h, p, n = rows.shape
    u = units.frm.shape[1]
    key_unit = _on(qp, "key_unit", qp.key_unit, dev)[:, None, None, :].expand(bsz, h, p, n)
    ru = torch.zeros((bsz, h, p, u), dtype=torch.float32, device=dev).scatter_add_(3, key_unit, rows)
    ru = ru.mul_(_on(qp, "weight", qp.weight, dev)[:, None, :, None]).transpose(1, 2).reshape(bsz * p, h, u)
    out = torch.zeros((len(an.seq) + 1, h, u), dtype=torch.float32, device=dev)  # the last: padding slots
    return out.index_add_(0, _on(qp, "anaphor", qp.anaphor.reshape(-1), dev), ru)[:-1]


class CorefReducer(_WordReducer):
    """Clark's Table 2 input: every head's most-attended candidate for every anaphor (:class:`CorefPredictions`).
    The feed must be given the corpus records (gold mentions and trees)."""

    name = "clark_syntax_coref"
    analysis = "clark_syntax"
    result_type = CorefPredictions
    needs_records = True

    def start(self, info) -> None:
        super().start(info)
        self.ties = np.zeros(self.k, dtype=np.int64)

    def _new(self, b, batch, units):
        an = batch_anaphors(batch, units)
        idx = an.per_row[b]
        return an.head[idx], an.head_unit[idx] >= 0, np.full((self.k, len(idx)), -1, dtype=np.int16), idx

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        """Nothing beyond rows: only the anaphors' head words' rows (``LayerView.query_rows``)."""
        return Needs()

    def _reduce_view(self, view, batch, units):
        an = batch_anaphors(batch, units)
        if not len(an.seq):
            return _no_anaphors(view.shape[1])
        return self._pick(anaphor_rows(view, batch, units, an), an, units)

    def _pick(self, rows, an, units):
        """(pred [H, A] record word or -1, tied [H, A]) from each anaphor head word's row [A, H, U]."""
        import torch

        dev = rows.device
        seq = _on(units, "an_seq", an.seq, dev)
        head = _on(units, "an_head_unit", an.head_unit, dev)
        cand = _on(units, "an_cand", an.candidates, dev)
        s = torch.where(cand[:, None, :], rows, -torch.inf)
        best, arg = s.max(-1)  # arg: the first maximum, as numpy's argmax
        ok = (best > 0) & (head >= 0)[:, None]
        word = _on(units, "unit_word", units.unit_word, dev)[seq[:, None], arg]
        return torch.where(ok, word, -1).T, (ok & ((s == best[..., None]).sum(-1) > 1)).T  # [H, A]

    def _store(self, seq, heads, b, host) -> None:
        pred, tied = host
        idx = seq[3]
        seq[2][heads] = pred[:, idx]
        self.ties[heads] += tied[:, idx].sum(-1)

    def result(self) -> CorefPredictions:
        seqs = self._sequences()
        return CorefPredictions(
            self.record_index,
            self.n_words,
            _offsets([len(s[0]) for s in seqs]),
            np.concatenate([s[0] for s in seqs]) if seqs else np.zeros(0, dtype=np.int64),
            np.concatenate([s[1] for s in seqs]) if seqs else np.zeros(0, dtype=bool),
            np.concatenate([s[2] for s in seqs], axis=1) if seqs else np.zeros((self.k, 0), dtype=np.int16),
            self.ties,
            self.info.n_layers,
            self.info.n_heads,
        )


class WordMapsReducer(_WordReducer):
    """Every head's word-level maps (:class:`WordMapSet`): what Clark's attention-based probes (Table 3) read."""

    name = "clark_syntax_word_maps"
    analysis = "clark_syntax"
    result_type = WordMapSet

    def start(self, info) -> None:
        super().start(info)
        self._lower: dict[int, np.ndarray] = {}  # units -> lower_cells (causal)

    def _new(self, b, batch, units):
        u = int(units.n_units[b])
        cells = u * (u + 1) // 2 if self.info.causal else u * u
        return units.unit_word[b, :u], units.unit_special[b, :u], np.zeros((self.k, cells), dtype=np.float32)

    def _reduce(self, w, batch, units):
        return (w,)

    def _store(self, seq, heads, b, host) -> None:
        u = len(seq[0])
        maps = host[0][b, :, :u, :u].reshape(-1, u * u)
        if not self.info.causal:
            seq[2][heads] = maps
            return
        keep = self._lower.get(u)
        if keep is None:  # the lower triangle's cells of u units: the same for every sequence and layer
            keep = self._lower[u] = lower_cells(np.array([u]))
        what = f"{self.name} of model {self.info.model!r} on corpus {self.info.corpus!r}"
        seq[2][heads] = encode_cells(maps, np.array([u]), "lower", what, keep)

    def result(self) -> WordMapSet:
        seqs = self._sequences()
        units = [len(s[0]) for s in seqs]
        return WordMapSet(
            self.record_index,
            self.n_words,
            _offsets(units),
            np.concatenate([s[0] for s in seqs]) if seqs else np.zeros(0, dtype=np.int64),
            np.concatenate([s[1] for s in seqs]) if seqs else np.zeros(0, dtype=np.int64),
            _offsets([s[2].size for s in seqs]),
            np.concatenate([s[2].reshape(-1) for s in seqs]) if seqs else np.zeros(0, dtype=np.float32),
            self.info.n_layers,
            self.info.n_heads,
            int(self.info.causal),
        )


def fused_plan(section: dict, corpus: str) -> list[Reducer]:
    """The reducers analysis.clark_syntax (the validated section) needs on ``corpus``: head predictions on the
    syntax corpus (Table 1), coreference predictions on the coreference corpora (Table 2), word-level maps on
    the probes' corpora (Table 3)."""
    if not section.get("activate", True):
        return []
    mode = section["word_mode"]
    out: list[Reducer] = []
    if corpus == section["syntax_corpus"]:
        out.append(HeadPredictionReducer(mode))
    if corpus in section["coref_corpora"].values():
        out.append(CorefReducer(mode))
    if corpus == section["probe_train"] or corpus in section["probe_eval"].values():
        out.append(WordMapsReducer(mode))
    return out


# --- the rules of Tables 1 and 2: every head's predictions (reduce_corpus), then the scores ---------------


def run_heads(
    maps: Sequence[str], records: Sequence[Record], settings: HeadSettings = HeadSettings(), model: str = ""
) -> dict[str, pd.DataFrame]:
    """Rule clark_syntax_heads: :func:`~headatlas.clark.syntax.syntax_tables` of every head's predictions on the corpus of ``maps``
    (shard directories), from :func:`headatlas.core.reduce.reduce_corpus` (replayed from a stored corpus,
    loaded from a fused one)."""
    t0 = time.time()
    pred = reduce_corpus(list(maps), HeadPredictionReducer(settings.word_mode), records)
    c = pred.correctness(records, settings.offsets, settings.poss_rule)
    log.info(
        "%s: %d dependents in %d sentences, %d words without pieces; exact ties (first word taken) "
        "dep->head %d, head->dep %d of %d predictions each (%.1f s)",
        model,
        len(c.relation),
        len(pred),
        c.n_missing,
        *pred.ties.sum(1).tolist(),
        pred.pred.shape[1] * pred.pred.shape[2],
        time.time() - t0,
    )
    return syntax_tables(c, model, settings)


def run_coref(
    splits: dict[str, tuple[Sequence[str], Sequence[Record]]],
    settings: CorefSettings = CorefSettings(),
    model: str = "",
) -> dict[str, pd.DataFrame]:
    """Rule clark_syntax_coref: score every head and baseline on the documents of each split
    (split -> shard directories, records) and return :func:`~headatlas.clark.coref.coref_tables`. Every head's predictions come from
    :func:`headatlas.core.reduce.reduce_corpus` (replayed from a stored corpus, loaded from a fused one)."""
    t0 = time.time()
    reducer = CorefReducer(settings.word_mode)
    preds = {s: (reduce_corpus(list(maps), reducer, records), records) for s, (maps, records) in splits.items()}
    res = coref_result(preds)
    kept = {s: int(p.n_words.sum()) for s, (p, _) in preds.items()}
    ties = sum(int(p.ties.sum()) for p, _ in preds.values())
    log.info(
        "%s: %d anaphors, words kept per split %s, %d anaphor heads without pieces, %d exact ties among %d "
        "predictions (first candidate taken) (%.1f s)",
        model,
        len(res.heads),
        kept,
        res.n_no_pieces,
        ties,
        res.heads.size,
        time.time() - t0,
    )
    tables = coref_tables(res, model, n_boot=settings.bootstrap, seed=settings.seed)
    log.info("table 2:\n%s", tables["table2"].to_string(index=False))
    return tables
