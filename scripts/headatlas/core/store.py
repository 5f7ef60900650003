"""The attention store: one HDF5 file per layer plus a token table.

Layout of one extraction output directory (one model x corpus x shard)::

    tokens.h5            token table, per-sequence index and metadata
      /input_ids         int32 [T]        all sequences' tokens, concatenated
      /piece             str   [T]        token strings
      /word              int32 [T]        word index within the record, -1 for special tokens
      /special           int8  [T]        0 none, 1 cls, 2 sep, 3 bos, 4 eos, 5 other
      /segment           int8  [T]        0 = A, 1 = B
      /token_offsets     int64 [N+1]      sequence k owns tokens token_offsets[k]:token_offsets[k+1]
      /lengths           int32 [N]        n, tokens per sequence
      /record_index      int64 [N]        index of the record in the corpus file
      /record_id         str   [N]
      /n_words           int32 [N]        words kept (fewer than the record's if truncated)
      attrs["meta"]      JSON: model, source, revision, tokenizer, dtype, config hash, versions, counts
    layer_LL.h5          one per layer (LL = 00, 01, ...)
      /attn              float32|float16 [H, sum n^2]  sequence k's true n x n block of head h is
                         attn[h, cell_offsets[k]:cell_offsets[k+1]].reshape(n, n); rows = queries
      /cell_offsets      int64 [N+1]
      /lengths           int32 [N]
      /head_vectors      float32 [N, H, d]  per-head context vector sum_j A_ij v_j (before the output
                         projection) at the representation position: [CLS] for encoders, the last
                         real token (or one past it) for decoders
      /hidden            float32 [N, D]     the layer's hidden state at the same position
    meta.json            the same metadata, for people

Padded rows and columns are never stored. A directory is written under a temporary name
and renamed when complete, so a killed job leaves nothing a later rule would accept.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

from .data import SPECIAL_NONE, TokenizedRecord

STR = h5py.string_dtype(encoding="utf-8")


def layer_file(directory: str | Path, layer: int) -> Path:
    return Path(directory) / f"layer_{layer:02d}.h5"


class AttentionWriter:
    """Write the maps of one extraction job; use as a context manager."""

    def __init__(
        self,
        out_dir: str | Path,
        tokenized: Sequence[TokenizedRecord],
        record_ids: Sequence[str],
        n_layers: int,
        n_heads: int,
        storage_dtype: str = "float32",
        meta: dict | None = None,
        maps: bool = True,
        rep_shapes: tuple[int, int] | None = None,
    ):
        if not tokenized:
            raise ValueError(f"{out_dir}: no sequence to store")
        self.out_dir = Path(out_dir)
        self.tmp = self.out_dir.with_name(self.out_dir.name + f".tmp{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.n_layers, self.n_heads = n_layers, n_heads
        self.dtype = np.dtype(storage_dtype)
        self.lengths = np.array([len(t) for t in tokenized], dtype=np.int64)
        self.cell_offsets = np.concatenate([[0], np.cumsum(self.lengths**2)])
        self.store_maps = maps
        self.written = np.zeros((n_layers, len(tokenized)), dtype=bool)
        self.reps_written = np.zeros((n_layers, len(tokenized)), dtype=bool)
        self.rep_shapes = rep_shapes
        self.meta = dict(meta or {})
        self._write_tokens(tokenized, record_ids)
        self.files = []
        for layer in range(n_layers):
            f = h5py.File(layer_file(self.tmp, layer), "w")
            if maps:
                f.create_dataset("attn", shape=(n_heads, int(self.cell_offsets[-1])), dtype=self.dtype)
            if rep_shapes is not None:
                f.create_dataset("head_vectors", shape=(len(tokenized), n_heads, rep_shapes[0]), dtype=np.float32)
                f.create_dataset("hidden", shape=(len(tokenized), rep_shapes[1]), dtype=np.float32)
            f.create_dataset("cell_offsets", data=self.cell_offsets)
            f.create_dataset("lengths", data=self.lengths.astype(np.int32))
            f.attrs["layer"] = layer
            f.attrs["n_heads"] = n_heads
            self.files.append(f)

    def _write_tokens(self, tokenized: Sequence[TokenizedRecord], record_ids: Sequence[str]) -> None:
        cat = lambda attr, dt: np.concatenate([np.asarray(getattr(t, attr), dtype=dt) for t in tokenized])  # noqa: E731
        with h5py.File(self.tmp / "tokens.h5", "w") as f:
            f.create_dataset("input_ids", data=cat("ids", np.int32))
            f.create_dataset("piece", data=[p for t in tokenized for p in t.pieces], dtype=STR)
            f.create_dataset("word", data=cat("word", np.int32))
            f.create_dataset("special", data=cat("special", np.int8))
            f.create_dataset("segment", data=cat("segment", np.int8))
            f.create_dataset("token_offsets", data=np.concatenate([[0], np.cumsum(self.lengths)]))
            f.create_dataset("lengths", data=self.lengths.astype(np.int32))
            f.create_dataset("record_index", data=np.array([t.record_index for t in tokenized], dtype=np.int64))
            f.create_dataset("record_id", data=list(record_ids), dtype=STR)
            f.create_dataset("n_words", data=np.array([t.n_words for t in tokenized], dtype=np.int32))
            f.create_dataset("truncated", data=np.array([t.truncated for t in tokenized], dtype=bool))

    def write(self, seq: int, layer: int, block: np.ndarray) -> None:
        """Store the [heads, n, n] block of sequence ``seq`` (its position in this store)."""
        n = int(self.lengths[seq])
        if block.shape != (self.n_heads, n, n):
            raise ValueError(f"sequence {seq}, layer {layer}: block shape {block.shape} != {(self.n_heads, n, n)}")
        a, b = self.cell_offsets[seq], self.cell_offsets[seq + 1]
        self.files[layer]["attn"][:, a:b] = block.reshape(self.n_heads, n * n).astype(self.dtype, copy=False)
        self.written[layer, seq] = True

    def write_cells(self, start: int, stop: int, layer: int, cells: np.ndarray) -> None:
        """Store the concatenated maps of sequences start..stop-1: [heads, sum n^2] in storage order."""
        a, b = self.cell_offsets[start], self.cell_offsets[stop]
        if cells.shape != (self.n_heads, b - a):
            raise ValueError(f"sequences {start}..{stop}, layer {layer}: block shape {cells.shape} != {(self.n_heads, b - a)}")
        self.files[layer]["attn"][:, a:b] = cells.astype(self.dtype, copy=False)
        self.written[layer, start:stop] = True

    def write_reps(self, seqs: np.ndarray, layer: int, head_vectors: np.ndarray, hidden: np.ndarray) -> None:
        """Store per-head vectors [B, H, d] and hidden states [B, D] of sequences ``seqs``."""
        order = np.argsort(seqs)
        f = self.files[layer]
        f["head_vectors"][np.asarray(seqs)[order]] = head_vectors[order]
        f["hidden"][np.asarray(seqs)[order]] = hidden[order]
        self.reps_written[layer, seqs] = True

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
        for what, done, wanted in (("maps", self.written, self.store_maps), ("representations", self.reps_written, self.rep_shapes is not None)):
            if wanted and not done.all():
                missing = np.argwhere(~done)[:3].tolist()
                raise RuntimeError(f"{self.out_dir}: {what} missing for (layer, sequence) {missing}")
        meta = dict(self.meta, n_layers=self.n_layers, n_heads=self.n_heads, n_sequences=len(self.lengths), storage_dtype=str(self.dtype))
        with h5py.File(self.tmp / "tokens.h5", "a") as f:
            f.attrs["meta"] = json.dumps(meta)
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(self.out_dir, ignore_errors=True)
        os.replace(self.tmp, self.out_dir)

    def abort(self) -> None:
        for f in self.files:
            try:
                f.close()
            except Exception:
                pass
        self.files = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.close()
            except BaseException:
                self.abort()  # an incomplete store leaves no temporary directory behind
                raise
        else:
            self.abort()
        return False


class AttentionStore:
    """Read the maps of one or more extraction directories (shards, in order) as one store.

    Sequence indices are global across shards, in shard order.
    """

    def __init__(self, directories: str | Path | Sequence[str | Path]):
        if isinstance(directories, (str, Path)):
            directories = [directories]
        self.dirs = [Path(d) for d in directories]
        if not self.dirs:
            raise ValueError("no extraction directory given")
        self.metas = []
        tables: dict[str, list] = {k: [] for k in ("input_ids", "piece", "word", "special", "segment")}
        lengths, record_index, record_id, n_words = [], [], [], []
        for d in self.dirs:
            path = d / "tokens.h5"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing; is {d} an extraction output?")
            with h5py.File(path, "r") as f:
                self.metas.append(json.loads(f.attrs["meta"]))
                for k in tables:
                    tables[k].append(f[k].asstr()[()] if k == "piece" else f[k][()])
                lengths.append(f["lengths"][()])
                record_index.append(f["record_index"][()])
                record_id.append(f["record_id"].asstr()[()])
                n_words.append(f["n_words"][()])
        self.meta = self.metas[0]
        for d, m in zip(self.dirs, self.metas):
            for key in ("model", "n_layers", "n_heads"):
                if m.get(key) != self.meta.get(key):
                    raise ValueError(f"{d}: {key} {m.get(key)!r} differs from {self.dirs[0]}'s {self.meta.get(key)!r}")
        self.n_layers, self.n_heads = int(self.meta["n_layers"]), int(self.meta["n_heads"])
        self.lengths = np.concatenate(lengths).astype(np.int64)
        self.record_index = np.concatenate(record_index)
        self.record_id = np.concatenate(record_id)
        self.n_words = np.concatenate(n_words)
        self.input_ids = np.concatenate(tables["input_ids"])
        self.piece = np.concatenate(tables["piece"])
        self.word = np.concatenate(tables["word"]).astype(np.int64)
        self.special = np.concatenate(tables["special"]).astype(np.int64)
        self.segment = np.concatenate(tables["segment"]).astype(np.int64)
        self.token_offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.cell_offsets = np.concatenate([[0], np.cumsum(self.lengths**2)])
        # which shard holds each sequence, and its local index there
        counts = [len(x) for x in lengths]
        self._shard = np.repeat(np.arange(len(counts)), counts)
        self._local = np.concatenate([np.arange(c) for c in counts])
        self._shard_cells = np.concatenate([[0], np.cumsum([int((x.astype(np.int64) ** 2).sum()) for x in lengths])])
        self._files: dict[tuple[int, int], h5py.File] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def _file(self, shard: int, layer: int) -> h5py.File:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} outside 0..{self.n_layers - 1}")
        key = (shard, layer)
        if key not in self._files:
            self._files[key] = h5py.File(layer_file(self.dirs[shard], layer), "r")
        return self._files[key]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def tokens(self, k: int) -> dict[str, np.ndarray]:
        """The token table rows of sequence k."""
        a, b = self.token_offsets[k], self.token_offsets[k + 1]
        return {
            "input_ids": self.input_ids[a:b],
            "piece": self.piece[a:b],
            "word": self.word[a:b],
            "special": self.special[a:b],
            "segment": self.segment[a:b],
        }

    def maps(self, layer: int, k: int, heads: slice | int | None = None) -> np.ndarray:
        """The [heads, n, n] maps (float32) of sequence k at ``layer``; ``heads`` picks some."""
        shard, local = int(self._shard[k]), int(self._local[k])
        f = self._file(shard, layer)
        off = f["cell_offsets"]
        a, b = int(off[local]), int(off[local + 1])
        n = int(self.lengths[k])
        sel = slice(None) if heads is None else heads
        block = f["attn"][sel, a:b].astype(np.float32)
        return block.reshape(block.shape[:-1] + (n, n))

    def head(self, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """One head across all sequences: (flat float32 cells, cell offsets [N+1]).

        Sequence k's map is ``flat[off[k]:off[k+1]].reshape(n_k, n_k)``.
        """
        parts = [self._file(s, layer)["attn"][head, :] for s in range(len(self.dirs))]
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return flat.astype(np.float32, copy=False), self.cell_offsets

    def head_maps(self, layer: int, head: int) -> list[np.ndarray]:
        """One head across all sequences as a list of n x n views."""
        flat, off = self.head(layer, head)
        return [flat[off[k] : off[k + 1]].reshape(n, n) for k, n in enumerate(self.lengths)]

    def layer_maps(self, layer: int, k_start: int = 0, k_stop: int | None = None) -> list[np.ndarray]:
        """All heads of a run of sequences in one read per shard: list of [H, n, n]."""
        k_stop = len(self) if k_stop is None else k_stop
        out = []
        for s in np.unique(self._shard[k_start:k_stop]):
            ks = np.arange(k_start, k_stop)[self._shard[k_start:k_stop] == s]
            f = self._file(int(s), layer)
            off = f["cell_offsets"][()]
            lo, hi = self._local[ks[0]], self._local[ks[-1]]
            block = f["attn"][:, off[lo] : off[hi + 1]].astype(np.float32)
            for k, local in zip(ks, range(lo, hi + 1)):
                n = int(self.lengths[k])
                out.append(block[:, off[local] - off[lo] : off[local + 1] - off[lo]].reshape(self.n_heads, n, n))
        return out

    def head_vectors(self, layer: int) -> np.ndarray:
        """Per-head representations of every sequence at ``layer``: [N, H, d] float32."""
        return np.concatenate([self._file(s, layer)["head_vectors"][()] for s in range(len(self.dirs))])

    def hidden(self, layer: int) -> np.ndarray:
        """The layer's hidden state at the representation position: [N, D] float32."""
        return np.concatenate([self._file(s, layer)["hidden"][()] for s in range(len(self.dirs))])

    def word_maps(self, layer: int, k: int, mode: str = "mean") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Clark's word-level maps of sequence k: see :func:`word_level`."""
        t = self.tokens(k)
        return word_level(self.maps(layer, k), t["word"], t["special"], mode)


def word_units(word: np.ndarray, special: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group tokens into units: each special token is its own unit, every word one unit.

    Returns (unit of each token, word index of each unit (-1 for specials), special kind of each unit),
    units ordered by their first token.
    """
    word = np.asarray(word)
    special = np.asarray(special)
    key = np.where(special != SPECIAL_NONE, -1 - np.arange(len(word)), word)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    unit = rank[inverse]
    first_tok = first[order]
    return unit, np.where(special[first_tok] != SPECIAL_NONE, -1, word[first_tok]), special[first_tok]


def word_level(maps: np.ndarray, word: np.ndarray, special: np.ndarray, mode: str = "mean"):
    """Clark et al.'s token-to-word aggregation of [H, n, n] maps.

    Attention *to* a split word is the sum over its pieces' columns; attention *from* it is
    the mean over its pieces' rows (``mode='mean'``, the paper) or its first piece's row
    (``mode='first'``, the released code). Word rows still sum to 1. Special tokens stay
    units of their own. Returns (maps [H, U, U], unit word index, unit special kind).
    """
    if mode not in ("mean", "first"):
        raise ValueError(f"mode must be 'mean' or 'first', not {mode!r}")
    unit, unit_word, unit_special = word_units(word, special)
    n, u = len(unit), len(unit_word)
    to = np.zeros((n, u), dtype=maps.dtype)
    to[np.arange(n), unit] = 1.0
    if mode == "mean":
        frm = to.T / to.sum(axis=0)[:, None]
    else:
        frm = np.zeros((u, n), dtype=maps.dtype)
        first = np.full(u, n)
        np.minimum.at(first, unit, np.arange(n))
        frm[np.arange(u), first] = 1.0
    return frm @ maps @ to, unit_word, unit_special
