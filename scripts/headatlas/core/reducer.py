"""The reducer's base types, shared by both feeds (:mod:`headatlas.core.reduce`: eager maps and replay;
:mod:`headatlas.core.mapfree`: q, k and LSE) and by every reducer: :class:`Reducer`, the batch's token table
:class:`ReduceBatch` with its memo, :class:`FeedInfo`, what a reducer declares (:class:`Needs`), the
reusable buffers (:func:`scratch`, :func:`clean_maps`) and :class:`ReduceError`. No torch at import time."""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .data import SPECIAL_NONE, Record, TokenizedRecord
from .models import ModelError

PAD_SPECIAL = -1  # special kind of padded positions in a ReduceBatch (matches no SPECIAL_* kind)


class ReduceError(RuntimeError):
    """A reducer failed; the message names the reducer, model, corpus and sequences."""


@dataclass(frozen=True)
class FeedInfo:
    """What a reducer learns before the first batch."""

    n_sequences: int
    n_layers: int
    n_heads: int
    model: str = ""
    model_kind: str = "encoder"  # encoder | decoder (causal mask)
    corpus: str = ""
    record_id: np.ndarray | None = None  # [N] ids of the sequences, in feed order
    first_index: int = 0  # records of the corpus before this feed (a shard's start), for reducers over a prefix

    @property
    def causal(self) -> bool:
        return self.model_kind == "decoder"


@dataclass(frozen=True)
class ReduceBatch:
    """The token table of one batch of sequences, right-padded to ``n`` = the longest.

    ``seq`` are the sequences' indices in the feed (store order / position in the tokenized list);
    token arrays are [B, n] numpy, padded with word -1, special :data:`PAD_SPECIAL`, segment 0, piece ''.
    ``records`` holds each sequence's corpus record (gold trees, coreference chains) when the feed was given
    the corpus, else None.
    """

    seq: np.ndarray
    lengths: np.ndarray
    word: np.ndarray
    special: np.ndarray
    segment: np.ndarray
    piece: np.ndarray
    record_index: np.ndarray
    n_words: np.ndarray
    records: tuple[Record, ...] | None = None
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # :meth:`memo`

    def __post_init__(self):
        b = len(self.seq)
        for name in ("word", "special", "segment", "piece"):
            if getattr(self, name).shape != (b, self.n):
                raise ValueError(f"ReduceBatch: {name} has shape {getattr(self, name).shape}, expected {(b, self.n)}")

    def __len__(self) -> int:
        return len(self.seq)

    @functools.cached_property
    def n(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    @classmethod
    def from_rows(
        cls, seq, rows: Sequence[dict], record_index, n_words, records: Sequence[Record] | None = None
    ) -> "ReduceBatch":
        """Pad per-sequence token rows (dicts of word, special, segment, piece arrays)."""
        lengths = np.array([len(r["word"]) for r in rows], dtype=np.int64)
        n = int(lengths.max()) if len(rows) else 0
        arrays = {
            "word": (-1, np.int64),
            "special": (PAD_SPECIAL, np.int64),
            "segment": (0, np.int64),
            "piece": ("", object),
        }
        out = {}
        for name, (fill, dtype) in arrays.items():
            a = np.full((len(rows), n), fill, dtype=dtype)
            for b, r in enumerate(rows):
                a[b, : lengths[b]] = r[name]
            out[name] = a
        record_index = np.asarray(record_index, dtype=np.int64)
        recs = None if records is None else tuple(records[int(i)] for i in record_index)
        return cls(
            np.asarray(seq, dtype=np.int64),
            lengths,
            record_index=record_index,
            n_words=np.asarray(n_words, dtype=np.int64),
            records=recs,
            **out,
        )

    @classmethod
    def from_store(cls, store, seq, records: Sequence[Record] | None = None) -> "ReduceBatch":
        """Sequences ``seq`` (global indices) of an :class:`~headatlas.core.store.AttentionStore`;
        ``records`` (the corpus) is indexed by the store's record_index."""
        seq = np.asarray(seq, dtype=np.int64)
        return cls.from_rows(
            seq, [store.tokens(int(k)) for k in seq], store.record_index[seq], store.n_words[seq], records
        )

    @classmethod
    def from_tokenized(
        cls, tokenized: Sequence[TokenizedRecord], seq, records: Sequence[Record] | None = None
    ) -> "ReduceBatch":
        """Sequences ``seq`` (positions in ``tokenized``); ``records`` is indexed by record_index."""
        seq = np.asarray(seq, dtype=np.int64)
        rows = [
            {"word": t.word, "special": t.special, "segment": t.segment, "piece": t.pieces}
            for t in (tokenized[int(k)] for k in seq)
        ]
        ts = [tokenized[int(k)] for k in seq]
        return cls.from_rows(seq, rows, [t.record_index for t in ts], [t.n_words for t in ts], records)

    # the batch's memo: what reducers derive once per batch and share between layers and reducers
    def memo(self, key, make):
        """The value kept under ``key`` for this batch, made by ``make()`` (no argument) the first time it is
        asked for. Keys are tuples that start with the caller's own name (``("clark_units", mode)``) and name the
        device of a tensor value; the value lives as long as the batch (replay interleaves batches, so keep
        per-batch state here, not on the reducer)."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = make()
            return value

    def recall(self, key, default=None):
        """The value kept under ``key``, or ``default`` when there is none (:meth:`memo` without making it)."""
        return self._memo.get(key, default)

    def keep(self, key, value):
        """Keep ``value`` under ``key`` (replacing what was there) and return it."""
        self._memo[key] = value
        return value

    def forget(self, key=None) -> None:
        """Drop what is kept under ``key`` (nothing when there is none); without a key, everything."""
        if key is None:
            self._memo.clear()
        else:
            self._memo.pop(key, None)

    def tensor(self, name: str, device) -> "torch.Tensor":  # noqa: F821
        """A token array (lengths, word, special, segment) as a torch tensor on ``device`` (cached)."""
        import torch

        return self.memo((name, str(device)), lambda: torch.as_tensor(getattr(self, name), device=device))

    def keys_per_row(self, device, causal: bool) -> "torch.Tensor":  # noqa: F821
        """[B, n] float64 k_i, the keys row i may attend to (i + 1 under a causal mask, else the length)."""
        import torch

        bsz, n = len(self), self.n
        if causal:
            return torch.arange(1, n + 1, device=device, dtype=torch.float64)[None, :].expand(bsz, n)
        return self.tensor("lengths", device).double()[:, None].expand(bsz, n)

    def masks(self, device, causal: bool) -> dict:
        """Cached boolean masks on ``device``: ``valid`` [B, n] real tokens, ``cell`` [B, n, n] real query
        and real key, ``allowed`` [B, n, n] cells a query may attend to (``cell``, and key <= query under
        a causal mask)."""
        import torch

        def make():
            n = self.n
            idx = torch.arange(n, device=device)
            valid = idx[None, :] < self.tensor("lengths", device)[:, None]
            cell = valid[:, :, None] & valid[:, None, :]
            allowed = cell & (idx[None, :] <= idx[:, None])[None] if causal else cell
            return {
                "valid": valid,
                "cell": cell,
                "allowed": allowed,
                "content": self.tensor("special", device) == SPECIAL_NONE,
            }

        return self.memo(("masks", str(device), causal), make)


_SCRATCH: dict = {}  # (slot, device) -> a reusable float32 buffer (:func:`scratch`)
_CLEAN: list = []  # the last clean_maps copy: [weakref(attn), weakref(batch), causal, tensor]


def scratch(slot: str, shape, device) -> "torch.Tensor":  # noqa: F821
    """A float32 buffer of ``shape`` on ``device`` whose contents are garbage, the same memory every time the
    same ``slot`` is asked for: the reducers' large temporaries reuse one allocation instead of taking a fresh
    one per layer, whose page faults cost a CPU more than the arithmetic on it (a fresh 300 MB tensor: 2 ns
    per cell, the log of it: 0.9 ns). The caller must be done with a slot's buffer before it asks for that
    slot again. :func:`release_scratch` frees them (a fused feed does at its end)."""
    import torch

    n = math.prod(shape)
    key = (slot, str(device))
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < n:
        _SCRATCH.pop(key, None)
        buf = _SCRATCH[key] = torch.empty(n, dtype=torch.float32, device=device)
    return buf[:n].view(shape)


def release_scratch() -> None:
    _SCRATCH.clear()
    _CLEAN.clear()


def clean_maps(attn, batch: ReduceBatch, causal: bool):
    """``attn`` as float32 with every cell outside a real query's visible keys set to 0 (padded rows and
    columns; above the diagonal under a causal mask, where softmax already gives 0). Shared by the reducers
    of one layer: the copy is kept for the tensor it was made from (in a :func:`scratch` buffer that the
    next layer's copy reuses); treat it as read-only and do not keep it past the layer.

    Padded cells must be finite (they are: padded keys are 0 and a padded query's row is a distribution
    over the real keys; replay pads with 0): they are multiplied by 0, which is 20 times faster on a CPU
    than a masked fill with a broadcast boolean mask."""
    import torch

    if _CLEAN and _CLEAN[0]() is attn and _CLEAN[1]() is batch and _CLEAN[2] == causal:
        return _CLEAN[3]
    allowed = batch.memo(
        ("allowed_f", str(attn.device), causal), lambda: batch.masks(attn.device, causal)["allowed"].float()[:, None]
    )
    a = torch.mul(attn.float(), allowed, out=scratch("clean", attn.shape, attn.device))
    _CLEAN[:] = [weakref.ref(attn), weakref.ref(batch), causal, a]
    return a


class Reducer:
    """Base class of a reducer; subclasses set ``name`` and implement ``update`` (one layer through a
    :class:`~headatlas.core.layer_view.LayerView`), ``layer_needs`` (what beyond rows and targets it reads),
    ``result`` and, to be saved and combined over shards, ``params``, ``to_arrays``, ``from_arrays`` and
    ``combine``."""

    name = "reducer"
    analysis = ""  # the config analysis key the class serves (errors and its spec name it): a class attribute
    needs_records = False  # True: the feed must be given the corpus records (trees)
    needs_outputs = False  # True: update_outputs(the model's output, with hidden states, batch) after each forward
    needs_maps = True  # False: update ignores the attention (the feed then need not capture it)
    full_rows: str | None = None  # why the reducer needs the maps themselves (MapsLayer.maps): no map-free feed
    keeps_layers = False  # True: holds rows of every layer of a batch it wants until its last layer (replay's budget)

    def start(self, info: FeedInfo) -> None:
        self.info = info

    def stop(self) -> None:
        """Called when the feed closes (also after a failure): remove what :meth:`start` attached to the model."""

    def layer_needs(self, batch: ReduceBatch, causal: bool) -> "Needs":
        """What :meth:`update` reads beyond rows and targets of the batch's layers (:class:`Needs`)."""
        return Needs()

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """One layer of ``batch``, as a :class:`~headatlas.core.layer_view.LayerView`."""
        raise NotImplementedError

    def update_outputs(self, outputs, batch: ReduceBatch) -> None:
        raise NotImplementedError

    def wants(self, batch: ReduceBatch) -> bool:
        """False when the reducer has nothing to do with this batch (a fused feed then keeps no layer for it)."""
        return True

    def result(self):
        raise NotImplementedError

    def params(self) -> dict:
        """JSON-able settings that change the result: the constructor's keyword arguments
        (:meth:`from_params` rebuilds the reducer from them)."""
        return {}

    @classmethod
    def from_params(cls, params: dict) -> "Reducer":
        return cls(**params)

    def to_arrays(self, result) -> dict[str, np.ndarray]:
        """The result as named numeric, bool or str arrays (:meth:`from_arrays` is the inverse)."""
        raise NotImplementedError

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]):
        raise NotImplementedError

    @classmethod
    def combine(cls, parts: list):
        """The results of consecutive shards, in shard order, as one result."""
        if len(parts) == 1:
            return parts[0]
        raise NotImplementedError(f"{cls.__name__} cannot combine shards")

    def spec(self) -> dict:
        """What rebuilds this reducer in another process (:func:`reducer_from_spec`): JSON-able. The reducer is
        named by its class's registered name (the class attribute ``name``, a key of ``headatlas.fused.REDUCERS``),
        so moving or renaming the class changes no extraction's cache key."""
        return {"analysis": self.analysis, "name": self.name, "reducer": type(self).name, "params": self.params()}


@dataclass
class Needs:
    """What a reducer reads from a batch's layers beyond rows (:meth:`Reducer.layer_needs`): ``entropy`` (each
    row's), ``smoothed_entropy`` (eps of the smoothed rows' entropy), ``values`` (name -> [B, n, c] key columns:
    (A.m)_i), ``lower`` (the same over keys j <= i only) and ``targets``. Names are shared between reducers (the
    same name must mean the same columns): a column is computed once."""

    entropy: bool = False
    smoothed_entropy: float | None = None  # eps: the entropy of the rows (1 - eps) A + eps / k_i
    values: dict = field(default_factory=dict)
    lower: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)  # name -> [B, n] key of each query (-1: none): LayerView.target


def reducer_failure(reducer: Reducer, info: FeedInfo, batch: ReduceBatch, layer, err: Exception) -> ReduceError:
    ids = batch.seq[:5].tolist() if info.record_id is None else [str(info.record_id[k]) for k in batch.seq[:5]]
    more = "" if len(batch) <= 5 else f" and {len(batch) - 5} more"
    where = "all layers" if layer is None else f"layer {layer + 1}"
    analysis = f"analysis {reducer.analysis}, " if reducer.analysis else ""
    return ReduceError(
        f"{analysis}reducer {reducer.name} failed on model {info.model or '?'}, corpus {info.corpus or '?'}, {where}, sequences {ids}{more}: {err}"
    )


def feed_outputs(reducers: Sequence[Reducer], info: FeedInfo, outputs, batch: ReduceBatch) -> None:
    """Hand the model's output of a batch to the reducers that read it (``needs_outputs``)."""
    for r in reducers:
        if r.needs_outputs:
            try:
                r.update_outputs(outputs, batch)
            except (ReduceError, ModelError):
                raise
            except Exception as e:
                raise reducer_failure(r, info, batch, None, e) from e


def stack_layers(done: dict) -> tuple[list[int], tuple]:
    """A batch's per-layer sums (layer -> a tuple of tensors, or None where a sum is not computed): its layers
    in order, and each sum stacked over them ([L, ...]), for reducers that finish a batch after its last layer."""
    import torch

    layers = sorted(done)
    first = done[layers[0]]
    # a split model's layers run on several devices: stack on the first layer's
    stacked = tuple(
        None if first[k] is None else torch.stack([done[i][k].to(first[k].device) for i in layers])
        for k in range(len(first))
    )
    return layers, stacked


def check_layers_done(reducer: Reducer, open_batches: int) -> None:
    """A reducer that finishes a batch when its last layer has come (``open_batches`` batches still wait for
    layers) must not return a result without them."""
    if open_batches:
        raise ReduceError(
            f"reducer {reducer.name}: {open_batches} batches were not given all {reducer.info.n_layers} layers; "
            "feed every layer of every batch (feed_layer) before result()"
        )


def stop_all(reducers: Sequence[Reducer]) -> None:
    for r in reducers:
        r.stop()
