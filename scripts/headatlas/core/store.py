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
      /attn              float32|float16 [H, sum c_k]  sequence k's stored cells of head h are
                         attn[h, cell_offsets[k]:cell_offsets[k+1]]; rows = queries. Full maps
                         (``map_layout: full``, encoders): c_k = n^2, the n x n block row by row.
                         Causal maps (``lower``, decoders): c_k = n(n+1)/2, the lower triangle
                         row by row (query i's keys 0..i); the cells above the diagonal are 0
                         by the causal mask, are checked to be 0 on write, and are not stored
      /cell_offsets      int64 [N+1]      offsets of the stored cells (the reader's
                         ``AttentionStore.cell_offsets`` are always those of full n x n maps)
      /lengths           int32 [N]
      /head_vectors      float32 [N, H, d]  per-head context vector sum_j A_ij v_j (before the output
                         projection) at the representation position: [CLS] for encoders, the last
                         real token (or one past it) for decoders
      /hidden            float32 [N, D]     the layer's hidden state at the same position
    meta.json            the same metadata, for people
    manifest.json        written last: layout version, map layout (full | lower), every file's
                         size and sha256, per layer its sequences and stored cells (and a
                         checksum of its representations)

Padded rows and columns are never stored. Every reader method returns full n x n maps
whatever the map layout (:func:`encode_cells` / :func:`decode_cells` are the only places that
know it). A directory is written under a temporary name
and renamed when complete, so a killed job leaves nothing a later rule would accept; the
next writer of the same output removes temporaries of dead processes. Readers check the
manifest on open and every map's values on read (see :class:`AttentionStore`);
:func:`verify_store` checks everything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

from .data import SPECIAL_NAMES, SPECIAL_NONE, TokenizedRecord
from .figures import head_label
from .integrity import MANIFEST, NESTED, check_target, dir_problems, file_problem, rebuild, replace_dir, walk_outputs
from .io import compressed

log = logging.getLogger("headatlas.core.store")

STR = h5py.string_dtype(encoding="utf-8")
# 1: no manifest (before the integrity checks); 2: manifest.json with sizes and checksums;
# 3: causal maps stored as their lower triangle (manifest key map_layout). Layout 2 stores hold
# full maps and are read as they are (READ_LAYOUTS).
LAYOUT_VERSION = 3
READ_LAYOUTS = (2, 3)
MAP_LAYOUTS = ("full", "lower")
CHECKSUM = "sha256"  # faster than blake2b here (767 vs 526 MB/s, hashlib, one core)
# Row sums of stored maps may miss 1 by rounding: float32 maps computed in float32 by ~n * 6e-8;
# float16 storage (2^-11 per cell) or half-precision compute (bfloat16: 2^-9) by up to ~2e-3.
ROW_SUM_TOL = {"float32": 1e-3, "half": 1e-2}
REBUILD = "delete the directory and rerun snakemake to extract it again"


class StoreError(ValueError):
    """A store on disk that is missing, damaged, inconsistent or holds invalid maps; the
    message names the file (and the layer, head and sequence for a bad value)."""


def layer_file(directory: str | Path, layer: int) -> Path:
    return Path(directory) / f"layer_{layer:02d}.h5"


def file_checksum(path: str | Path, block: int = 8 * 2**20) -> str:
    h = hashlib.new(CHECKSUM)
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def data_checksum(array: np.ndarray) -> str:
    """Checksum of an array's contents (C order bytes)."""
    return hashlib.new(CHECKSUM, np.ascontiguousarray(array).data).hexdigest()


def row_sum_tolerance(meta: dict) -> float:
    """How far a stored row's sum may lie from 1 (see :data:`ROW_SUM_TOL`)."""
    full = meta.get("storage_dtype", "float32") == "float32" and meta.get("compute_dtype", "float32") == "float32"
    return ROW_SUM_TOL["float32" if full else "half"]


def budget_runs(sizes: np.ndarray, budget: int, groups: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Consecutive [start, stop) runs of items whose ``sizes`` sum to at most ``budget`` (at
    least one item each) and that never mix two ``groups`` (e.g. shards)."""
    out, start, acc = [], 0, 0
    for i, b in enumerate(np.asarray(sizes, dtype=np.int64).tolist()):
        if i > start and (acc + b > budget or (groups is not None and groups[i] != groups[start])):
            out.append((start, i))
            start, acc = i, 0
        acc += b
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def row_starts(lengths: np.ndarray) -> np.ndarray:
    """The flat cell index of every row (query token) of sequences stored back to back."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cell_off = np.concatenate([[0], np.cumsum(lengths**2)])[:-1]
    seq = np.repeat(np.arange(len(lengths)), lengths)
    tok_off = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    return cell_off[seq] + (np.arange(int(lengths.sum())) - tok_off[seq]) * lengths[seq]


def stored_cells(lengths: np.ndarray, map_layout: str = "full") -> np.ndarray:
    """Cells stored per sequence: n^2 (``full``) or n(n+1)/2 (``lower``: the causal triangle)."""
    n = np.asarray(lengths, dtype=np.int64)
    if map_layout not in MAP_LAYOUTS:
        raise ValueError(f"map_layout must be one of {MAP_LAYOUTS}, not {map_layout!r}")
    return n * n if map_layout == "full" else n * (n + 1) // 2


def lower_cells(lengths: np.ndarray) -> np.ndarray:
    """The flat full-map index (sequences stored back to back, n^2 cells each) of every cell of the
    lower triangles (key <= query), in stored order: sequence by sequence, row by row."""
    n = np.asarray(lengths, dtype=np.int64)
    # one entry per query row t: its length (i + 1 cells kept) and the full index of its first cell
    rows = row_starts(n)
    pos = np.arange(int(n.sum())) - np.repeat(np.concatenate([[0], np.cumsum(n)])[:-1], n)
    keep = pos + 1
    first = np.repeat(np.cumsum(keep) - keep, keep)
    return np.repeat(rows, keep) + (np.arange(int(keep.sum())) - first)


def encode_cells(
    cells: np.ndarray, lengths: np.ndarray, map_layout: str, where: str = "", index: np.ndarray | None = None
) -> np.ndarray:
    """Full maps [h, sum n^2] of sequences stored back to back -> the stored cells of ``map_layout``.
    ``lower`` keeps the lower triangles; a nonzero cell above a diagonal is a ValueError (the
    model is not causal: the layout would lose it). ``index`` is :func:`lower_cells` of ``lengths``
    when the caller has it already."""
    if map_layout == "full":
        return cells
    keep = lower_cells(lengths) if index is None else index
    out = cells[..., keep]
    lost = np.count_nonzero(cells) - np.count_nonzero(out)  # exact: the cells above the diagonals that are not 0
    if lost:
        raise ValueError(
            f"{where}: attention above the diagonal ({lost} nonzero cells) in a store of causal (lower-triangle) "
            "maps; is the model causal? (set its arch: encoder)"
        )
    return out


def decode_cells(
    stored: np.ndarray, lengths: np.ndarray, map_layout: str, index: np.ndarray | None = None
) -> np.ndarray:
    """The inverse of :func:`encode_cells`: full maps [h, sum n^2] (zeros above the diagonals);
    ``index`` is :func:`lower_cells` of ``lengths`` when the caller has it already."""
    if map_layout == "full":
        return stored
    full = np.zeros(stored.shape[:-1] + (int((np.asarray(lengths, dtype=np.int64) ** 2).sum()),), dtype=stored.dtype)
    full[..., lower_cells(lengths) if index is None else index] = stored
    return full


def map_faults(
    cells: np.ndarray,
    lengths: np.ndarray,
    tol: float,
    stop_at: int | None = 1,
    starts: np.ndarray | None = None,
    sums: np.ndarray | None = None,
) -> list[tuple[int, int, int, str]]:
    """Check flat maps [h, sum n^2] of sequences with ``lengths`` stored back to back: every cell
    finite and within [0, 1 + tol], every row summing to 1 within ``tol``. Returns up to
    ``stop_at`` faults (row of ``cells``, sequence, query row, what); [] when all is well.
    ``starts`` (the :func:`row_starts` of ``lengths``) and ``sums`` (the row sums,
    ``np.add.reduceat(cells, starts, axis=1)``) may be given to save recomputing them."""
    cells = np.atleast_2d(cells)
    if cells.size == 0:
        return []
    starts = row_starts(lengths) if starts is None else starts
    sums = np.add.reduceat(cells, starts, axis=1) if sums is None else sums
    # cells >= 0 and every row summing to at most 1 + tol bound each cell by 1 + tol; NaN and inf
    # fail one of the comparisons: two passes over the cells (the row sums, then the minimum)
    if sums.min() >= 1 - tol and sums.max() <= 1 + tol and cells.min() >= 0:
        return []
    # slow path, only on a fault: say where
    tok_seq = np.repeat(np.arange(len(lengths)), lengths)
    tok_off = np.concatenate([[0], np.cumsum(lengths)])
    bad_row = ~(np.abs(sums - 1) <= tol)
    bad_cell = ~((cells >= 0) & (cells <= 1 + tol))
    row_of_cell = np.searchsorted(starts, np.arange(cells.shape[1]), side="right") - 1
    faults = []
    for h, c in zip(*np.nonzero(bad_cell)):
        t = row_of_cell[c]
        faults.append(
            (int(h), int(tok_seq[t]), int(t - tok_off[tok_seq[t]]), f"value {float(cells[h, c]):.6g} outside [0, 1]")
        )
        if stop_at and len(faults) >= stop_at:
            return faults
    for h, t in zip(*np.nonzero(bad_row)):
        faults.append(
            (
                int(h),
                int(tok_seq[t]),
                int(t - tok_off[tok_seq[t]]),
                f"row sums to {float(sums[h, t]):.6g}, not 1 (tolerance {tol:g})",
            )
        )
        if stop_at and len(faults) >= stop_at:
            break
    return faults


def remove_stale_temporaries(out: str | Path) -> list[Path]:
    """Remove ``{out}.tmp<PID>`` left next to ``out`` by killed jobs (PID no longer alive here)."""
    out = Path(out)
    removed = []
    if not out.parent.is_dir():
        return removed
    pattern = re.compile(re.escape(out.name) + r"\.tmp(\d+)$")
    for p in out.parent.iterdir():
        m = pattern.match(p.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            log.warning("%s: left in place, process %s is still running", p, m.group(1))
            continue
        except ProcessLookupError:
            pass
        except PermissionError:  # alive, another user's
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        log.warning("%s: removed the temporary output of a killed job", p)
        removed.append(p)
    return removed


def read_manifest(directory: str | Path) -> dict:
    """The store's manifest, after the cheap checks: present, current layout, every listed file
    there with its recorded size. Raises :class:`StoreError` naming the file."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise StoreError(f"{directory}: missing; is it an extraction output?")
    if not path.is_file():
        raise StoreError(
            f"{path}: missing. The store was written by an older headatlas (layout version 1) or by a job that did "
            f"not finish; {REBUILD}"
        )
    try:
        man = json.loads(path.read_text())
        version, files = man["layout_version"], man["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{path}: unreadable manifest ({e}); {REBUILD}") from None
    if version not in READ_LAYOUTS:
        raise StoreError(
            f"{path}: store layout version {version}, this headatlas reads versions "
            f"{', '.join(map(str, READ_LAYOUTS))}; {REBUILD}"
        )
    if man.get("map_layout", "full") not in MAP_LAYOUTS:
        raise StoreError(f"{path}: unknown map layout {man.get('map_layout')!r}; {REBUILD}")
    for name, entry in files.items():
        f = directory / name
        if not f.is_file():
            raise StoreError(f"{f}: missing (listed in {path}); {REBUILD}")
        size = f.stat().st_size
        if size != entry["size"]:
            raise StoreError(f"{f}: {size} bytes, the manifest says {entry['size']} (truncated or replaced); {REBUILD}")
    return man


SHARD_NAME = re.compile(r"shard(\d+)of(\d+)")


def store_dirs(directory: str | Path) -> list[Path]:
    """The store directories ``directory`` names: itself when it holds a manifest; else, for a corpus directory
    (``results/attention/{model}/{corpus}``), its ``shard{i}of{n}`` stores in shard order. A directory that is
    neither is an error listing the stores found below it (``results/`` or a model directory)."""
    d = Path(directory)
    d = d.parent if d.name == MANIFEST else d
    if (d / MANIFEST).is_file() or not d.is_dir():
        return [d]
    shards = {m: p for p in d.iterdir() if (m := SHARD_NAME.fullmatch(p.name)) and p.is_dir()}
    if shards:
        faults = shard_set_faults(d, [m.group(0) for m in shards])
        if faults:
            raise StoreError(faults[0])
        return [shards[m] for m in sorted(shards, key=lambda m: int(m.group(1)))]
    found = sorted(p.parent for p in d.rglob(MANIFEST) if p.parent.name != NESTED[1])
    if not found:
        return [d]
    corpora = sorted(
        {p.parent for p in found if SHARD_NAME.fullmatch(p.name)}
        | {p for p in found if not SHARD_NAME.fullmatch(p.name)}
    )
    shown = "\n  ".join(str(p) for p in corpora[:12]) + ("\n  ..." if len(corpora) > 12 else "")
    noun = "corpus" if len(corpora) == 1 else "corpora"
    raise StoreError(f"{d}: not a store; it holds the stores of {len(corpora)} {noun}:\n  {shown}\nname one of them")


def store_problem(directory: str | Path) -> str | None:
    """Why an existing store directory is not usable, or None when it is, or when it does not exist (then it is
    simply not built yet): the cheap checks of :func:`read_manifest`, on its nested ``sample/`` store too, and the
    checksums of its small files (fused results, the sample's manifest)."""
    directory = Path(directory)
    if not directory.exists():
        return None
    try:
        man = read_manifest(directory)
        if (directory / NESTED[1]).is_dir() or f"{NESTED[1]}/{MANIFEST}" in man["files"]:
            read_manifest(directory / NESTED[1])
    except StoreError as e:
        return str(e)
    for name, entry in man["files"].items():
        if name.startswith(tuple(f"{n}/" for n in NESTED)) and entry.get(man.get("checksum", CHECKSUM)):
            if file_checksum(directory / name) != entry[man.get("checksum", CHECKSUM)]:
                return (
                    f"{directory / name}: {CHECKSUM} differs from {directory / MANIFEST} (contents changed); {REBUILD}"
                )
    return None


def reduced_problem(path: str | Path) -> str | None:
    """Why a fused result ``<store>/reduced/<name>.h5`` cannot be read (missing from, or not matching, its
    store's manifest), or None (also for a result saved outside a store)."""
    path = Path(path)
    store = path.parent.parent
    if not (store / MANIFEST).is_file():  # not inside a store (a reader of stores has refused one without manifest)
        return None
    try:
        man = read_manifest(store)
    except StoreError as e:
        return str(e)
    entry = man["files"].get(f"{NESTED[0]}/{path.name}")
    if entry is None:
        return f"{path}: not listed in {store / MANIFEST}; {REBUILD}"
    want = entry.get(man.get("checksum", CHECKSUM))
    if want is not None and file_checksum(path) != want:
        return f"{path}: {CHECKSUM} differs from {store / MANIFEST} (contents changed); {REBUILD}"
    return None


class WholeChunks:
    """Write rows of a dataset, given in any order, only as whole chunks of its first axis.

    A compressed chunk written twice (once per extraction window that holds some of its rows) is
    stored anew, and the space of its first copy stays unused in the file; so a chunk's rows wait
    here until the chunk is complete (a few partial chunks per dataset, about 512 KiB each)."""

    def __init__(self, dataset: h5py.Dataset):
        self.dataset = dataset
        self.rows = dataset.chunks[0] if dataset.chunks else max(1, dataset.shape[0])
        self.partial: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # chunk -> (rows, which are set)

    def write(self, index, values: np.ndarray) -> None:
        index = np.asarray(index, dtype=np.int64)
        chunk_of = index // self.rows
        n = self.dataset.shape[0]
        for c in np.unique(chunk_of).tolist():
            lo, hi = c * self.rows, min(n, (c + 1) * self.rows)
            mine = chunk_of == c
            block, done = self.partial.pop(c, None) or (
                np.zeros((hi - lo,) + self.dataset.shape[1:], self.dataset.dtype),
                np.zeros(hi - lo, dtype=bool),
            )
            block[index[mine] - lo] = values[mine]
            done[index[mine] - lo] = True
            if done.all():
                self.dataset[lo:hi] = block
            else:
                self.partial[c] = (block, done)

    def flush(self) -> None:
        """Write the chunks still incomplete (rows never given stay zero; the writer reports them missing)."""
        for c, (block, _) in sorted(self.partial.items()):
            self.dataset[c * self.rows : c * self.rows + len(block)] = block
        self.partial = {}


class AttentionWriter:
    """Write the maps of one extraction job; use as a context manager.

    ``close`` writes ``manifest.json`` last (sizes and checksums of every file) and renames the
    temporary directory to ``out_dir``; an empty ``tokenized`` gives a valid empty store.
    ``map_layout='lower'`` (causal models) stores only the lower triangle of each map; the
    ``write`` methods still take full maps."""

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
        map_layout: str = "full",
    ):
        self.out_dir = check_target(out_dir)
        self.tmp = self.out_dir.with_name(self.out_dir.name + f".tmp{os.getpid()}")
        remove_stale_temporaries(self.out_dir)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.n_layers, self.n_heads = n_layers, n_heads
        self.dtype = np.dtype(storage_dtype)
        self.lengths = np.array([len(t) for t in tokenized], dtype=np.int64)
        self.cell_offsets = np.concatenate([[0], np.cumsum(self.lengths**2)]).astype(np.int64)  # full maps
        self.map_layout = map_layout
        self.stored_offsets = np.concatenate([[0], np.cumsum(stored_cells(self.lengths, map_layout))]).astype(np.int64)
        self.store_maps = maps
        self.written = np.zeros((n_layers, len(tokenized)), dtype=bool)
        self.reps_written = np.zeros((n_layers, len(tokenized)), dtype=bool)
        self.rep_shapes = rep_shapes
        self.meta = dict(meta or {})
        self._write_tokens(tokenized, record_ids)
        self.files, self.rep_rows = [], []
        for layer in range(n_layers):
            f = h5py.File(layer_file(self.tmp, layer), "w")
            if maps:
                f.create_dataset("attn", shape=(n_heads, int(self.stored_offsets[-1])), dtype=self.dtype)
            if rep_shapes is not None:
                for key, shape in (
                    ("head_vectors", (len(tokenized), n_heads, rep_shapes[0])),
                    ("hidden", (len(tokenized), rep_shapes[1])),
                ):
                    f.create_dataset(key, shape=shape, dtype=np.float32, **compressed(shape, np.float32))
                self.rep_rows.append({key: WholeChunks(f[key]) for key in ("head_vectors", "hidden")})
            f.create_dataset("cell_offsets", data=self.stored_offsets)
            f.create_dataset("lengths", data=self.lengths.astype(np.int32))
            f.attrs["layer"] = layer
            f.attrs["n_heads"] = n_heads
            self.files.append(f)

    def _write_tokens(self, tokenized: Sequence[TokenizedRecord], record_ids: Sequence[str]) -> None:
        def cat(attr, dt):
            return np.concatenate([np.asarray(getattr(t, attr), dtype=dt) for t in tokenized] + [np.zeros(0, dtype=dt)])

        with h5py.File(self.tmp / "tokens.h5", "w") as f:
            f.create_dataset("input_ids", data=cat("ids", np.int32))
            f.create_dataset("piece", data=np.array([p for t in tokenized for p in t.pieces], dtype=object), dtype=STR)
            f.create_dataset("word", data=cat("word", np.int32))
            f.create_dataset("special", data=cat("special", np.int8))
            f.create_dataset("segment", data=cat("segment", np.int8))
            f.create_dataset("token_offsets", data=np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64))
            f.create_dataset("lengths", data=self.lengths.astype(np.int32))
            f.create_dataset("record_index", data=np.array([t.record_index for t in tokenized], dtype=np.int64))
            f.create_dataset("record_id", data=np.array(list(record_ids), dtype=object), dtype=STR)
            f.create_dataset("n_words", data=np.array([t.n_words for t in tokenized], dtype=np.int32))
            f.create_dataset("truncated", data=np.array([t.truncated for t in tokenized], dtype=bool))

    def write(self, seq: int, layer: int, block: np.ndarray) -> None:
        """Store the [heads, n, n] block of sequence ``seq`` (its position in this store)."""
        n = int(self.lengths[seq])
        if block.shape != (self.n_heads, n, n):
            raise ValueError(f"sequence {seq}, layer {layer + 1}: block shape {block.shape} != {(self.n_heads, n, n)}")
        self.write_cells(seq, seq + 1, layer, block.reshape(self.n_heads, n * n))

    def write_cells(self, start: int, stop: int, layer: int, cells: np.ndarray) -> None:
        """Store the concatenated maps of sequences start..stop-1: [heads, sum n^2] in storage order."""
        a, b = self.cell_offsets[start], self.cell_offsets[stop]
        if cells.shape != (self.n_heads, b - a):
            raise ValueError(
                f"sequences {start}..{stop}, layer {layer + 1}: block shape {cells.shape} != {(self.n_heads, b - a)}"
            )
        where = f"{self.out_dir}: layer {layer + 1}, sequences {start}..{stop - 1}"
        stored = encode_cells(cells, self.lengths[start:stop], self.map_layout, where)
        a, b = self.stored_offsets[start], self.stored_offsets[stop]
        self.files[layer]["attn"][:, a:b] = stored.astype(self.dtype, copy=False)
        self.written[layer, start:stop] = True

    def write_reps(self, seqs: np.ndarray, layer: int, head_vectors: np.ndarray, hidden: np.ndarray) -> None:
        """Store per-head vectors [B, H, d] and hidden states [B, D] of sequences ``seqs``."""
        rows = self.rep_rows[layer]
        rows["head_vectors"].write(seqs, head_vectors)
        rows["hidden"].write(seqs, hidden)
        self.reps_written[layer, seqs] = True

    def close(self) -> None:
        for rows in self.rep_rows:
            for chunked in rows.values():
                chunked.flush()
        self.rep_rows = []
        for f in self.files:
            f.close()
        self.files = []
        for what, done, wanted in (
            ("maps", self.written, self.store_maps),
            ("representations", self.reps_written, self.rep_shapes is not None),
        ):
            if wanted and not done.all():
                missing = "; ".join(f"layer {la + 1}, sequence {k}" for la, k in np.argwhere(~done)[:3].tolist())
                raise RuntimeError(f"{self.out_dir}: {what} missing for {missing}")
        meta = dict(
            self.meta,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_sequences=len(self.lengths),
            storage_dtype=str(self.dtype),
            layout_version=LAYOUT_VERSION,
            map_layout=self.map_layout,
        )
        with h5py.File(self.tmp / "tokens.h5", "a") as f:
            f.attrs["meta"] = json.dumps(meta)
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        self._write_manifest()
        replace_dir(self.tmp, self.out_dir, sealed=False)  # its manifest is its seal

    def _write_manifest(self) -> None:
        """manifest.json, last: every file's size and checksum, each layer's counts."""
        n_cells = int(self.stored_offsets[-1])
        layers = {}
        for layer in range(self.n_layers):
            path = layer_file(self.tmp, layer)
            entry = {
                "n_sequences": len(self.lengths),
                "n_cells": n_cells if self.store_maps else 0,
                "n_heads": self.n_heads,
            }
            if self.rep_shapes is not None:  # small, read whole, and not checkable by value: checksum their contents
                with h5py.File(path, "r") as f:
                    entry["data_" + CHECKSUM] = {key: data_checksum(f[key][()]) for key in ("head_vectors", "hidden")}
            layers[path.name] = entry
        # a fused extraction's results and its sample store (their own manifest) travel with the store
        nested = sorted(str(p.relative_to(self.tmp)) for p in self.tmp.glob(f"{NESTED[0]}/*.h5"))
        nested += [f"{NESTED[1]}/{MANIFEST}"] if (self.tmp / NESTED[1] / MANIFEST).is_file() else []
        names = ["tokens.h5", "meta.json"] + list(layers) + nested
        files = {
            name: {"size": (self.tmp / name).stat().st_size, CHECKSUM: file_checksum(self.tmp / name)} for name in names
        }
        manifest = {
            "layout_version": LAYOUT_VERSION,
            "map_layout": self.map_layout,
            "checksum": CHECKSUM,
            "n_sequences": len(self.lengths),
            "n_tokens": int(self.lengths.sum()),
            "n_layers": self.n_layers,
            "maps": bool(self.store_maps),
            "reps": self.rep_shapes is not None,
            "files": files,
            "layers": layers,
        }
        part = self.tmp / (MANIFEST + ".part")
        part.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(part, self.tmp / MANIFEST)

    def abort(self) -> None:
        self.rep_rows = []
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


def _index(value, size: int, what: str) -> int:
    """The store's one index rule: a Python or numpy integer in 0..size-1; negative indices,
    floats and booleans are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} index must be an integer, not {type(value).__name__} {value!r}")
    value = operator.index(value)
    if not 0 <= value < size:
        raise IndexError(f"{what} index {value} outside 0..{size - 1} (0-based; negative indices are not accepted)")
    return value


def _read_tokens(d: Path, manifest: dict) -> dict:
    """The token table, checked: its checksum (the table is small and read whole anyway), then
    its consistency with itself and the manifest."""
    path = d / "tokens.h5"
    want = manifest["files"].get("tokens.h5", {}).get(manifest.get("checksum", CHECKSUM))
    if want is not None and file_checksum(path) != want:
        raise StoreError(
            f"{path}: {manifest.get('checksum', CHECKSUM)} checksum differs from the manifest (contents changed); {REBUILD}"
        )
    try:
        with h5py.File(path, "r") as f:
            t = {
                k: (f[k].asstr()[()] if k in ("piece", "record_id") else f[k][()])
                for k in (
                    "input_ids",
                    "piece",
                    "word",
                    "special",
                    "segment",
                    "token_offsets",
                    "lengths",
                    "record_index",
                    "record_id",
                    "n_words",
                )
            }
            t["meta"] = json.loads(f.attrs["meta"])
    except Exception as e:  # h5py raises OSError, KeyError, ValueError, UnicodeDecodeError ... on damage
        raise StoreError(f"{path}: cannot read the token table ({type(e).__name__}: {e}); {REBUILD}") from None
    lengths = t["lengths"].astype(np.int64)
    n, n_tok = len(lengths), int(lengths.sum())
    problems = []
    if n != manifest["n_sequences"] or n_tok != manifest["n_tokens"]:
        problems.append(
            f"{n} sequences and {n_tok} tokens, the manifest says {manifest['n_sequences']} and {manifest['n_tokens']}"
        )
    if n and lengths.min() < 1:
        problems.append("a sequence of length < 1")
    if not np.array_equal(t["token_offsets"], np.concatenate([[0], np.cumsum(lengths)])):
        problems.append("token_offsets do not match lengths")
    for k in ("input_ids", "piece", "word", "special", "segment"):
        if len(t[k]) != n_tok:
            problems.append(f"{k} has {len(t[k])} entries, not {n_tok}")
    for k in ("record_index", "record_id", "n_words"):
        if len(t[k]) != n:
            problems.append(f"{k} has {len(t[k])} entries, not {n}")
    if n > 1 and not (np.diff(t["record_index"]) > 0).all():
        problems.append("record_index not increasing")
    if n_tok and (t["word"].min() < -1 or not np.isin(t["special"], list(SPECIAL_NAMES)).all()):
        problems.append("word or special out of range")
    if problems:
        raise StoreError(f"{path}: inconsistent token table: {'; '.join(problems)}; {REBUILD}")
    return t


class AttentionStore:
    """Read the maps of one or more extraction directories (shards, in order) as one store.

    Sequence indices are global across shards, in shard order. Every index (sequence, layer,
    head) is an integer in 0..size-1: negative indices, floats and out-of-range runs raise.
    Opening checks each directory's manifest (present, current layout, file sizes) and token
    table (checksum and consistency); every read of maps checks its values (finite, in [0, 1], rows summing to 1 within
    :func:`row_sum_tolerance`) and raises :class:`StoreError` naming file, layer, head and record; maps one object
    has already checked (per layer, head and sequence) are not checked again when read again. A read of
    representations checks their checksum (they are small and read whole).
    """

    def __init__(self, directories: str | Path | Sequence[str | Path], check_values: bool = True):
        if isinstance(directories, (str, Path)):
            directories = [directories]
        self.dirs = [Path(d).parent if Path(d).name == MANIFEST else Path(d) for d in directories]
        if not self.dirs:
            raise ValueError("no extraction directory given")
        self.check_values = check_values
        self.manifests = [read_manifest(d) for d in self.dirs]
        tables = [_read_tokens(d, m) for d, m in zip(self.dirs, self.manifests)]
        self.metas = [t["meta"] for t in tables]
        self.meta = self.metas[0]
        self._check_shards([t["record_index"] for t in tables])
        self.n_layers, self.n_heads = int(self.meta["n_layers"]), int(self.meta["n_heads"])
        cat = lambda key: np.concatenate([t[key] for t in tables])  # noqa: E731
        self.lengths = cat("lengths").astype(np.int64)
        self.record_index = cat("record_index")
        self.record_id = cat("record_id")
        self.n_words = cat("n_words")
        self.input_ids = cat("input_ids")
        self.piece = cat("piece")
        self.word = cat("word").astype(np.int64)
        self.special = cat("special").astype(np.int64)
        self.segment = cat("segment").astype(np.int64)
        self.token_offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.cell_offsets = np.concatenate([[0], np.cumsum(self.lengths**2)])
        layouts = {m.get("map_layout", "full") for m in self.manifests}
        if len(layouts) > 1:
            raise StoreError(f"{self.dirs[0]}: shards of one store with different map layouts {sorted(layouts)}")
        self.map_layout = layouts.pop()  # how the cells lie on disk; every read returns full maps
        self.stored_offsets = np.concatenate([[0], np.cumsum(stored_cells(self.lengths, self.map_layout))])
        counts = [len(t["lengths"]) for t in tables]
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(
            np.int64
        )  # shard s holds k in [starts[s], starts[s+1])
        self.shard_of = np.repeat(np.arange(len(counts)), counts)
        self.tolerance = row_sum_tolerance(self.meta)
        self._row_starts = row_starts(self.lengths)
        self._files: dict[tuple[int, int], h5py.File] = {}
        # layer -> [H, N]: maps whose values this object has already checked (a second read is not checked again)
        self._verified: dict[int, np.ndarray] = {}
        self._sums = None  # (layer, k0, k1, row sums) of the last all-heads check
        self._lower_index = (None, None)  # ((k0, k1), lower_cells) of the last run read from a lower-triangle store

    def _check_shards(self, record_index: list[np.ndarray]) -> None:
        """Shards of one extraction (model, corpus, settings), each once, in order."""
        first = self.dirs[0]
        for d, m in zip(self.dirs[1:], self.metas[1:]):
            for key in (
                "model",
                "corpus",
                "n_layers",
                "n_heads",
                "storage_dtype",
                "config_hash",
                "maps",
                "reps",
                "n_shards",
            ):
                if m.get(key) != self.meta.get(key):
                    raise StoreError(
                        f"{d}: {key} {m.get(key)!r} differs from {first}'s {self.meta.get(key)!r}; shards of one store must come from one extraction"
                    )
        if len(self.dirs) > 1:
            seen: dict[int, Path] = {}
            for d, m in zip(self.dirs, self.metas):
                if "shard" not in m:
                    raise StoreError(f"{d / 'meta.json'}: no shard index; cannot combine it with other directories")
                s = int(m["shard"])
                if s in seen:
                    raise StoreError(f"{d}: shard {s} given twice (also {seen[s]})")
                if seen and s < max(seen):
                    raise StoreError(f"{d}: shard {s} given after shard {max(seen)}; give shards in order")
                seen[s] = d
            missing = sorted(set(range(int(self.meta.get("n_shards") or 0))) - set(seen))
            if missing:
                raise StoreError(
                    f"{first.parent}: incomplete set of shards: shards {missing} of {self.meta['n_shards']} not "
                    "given; a store of several shards is read with all of them"
                )
            last = -1
            for d, ri in zip(self.dirs, record_index):
                if len(ri) and ri[0] <= last:
                    raise StoreError(
                        f"{d}: its records start at {ri[0]}, not after the previous shard's last record {last}"
                    )
                last = int(ri[-1]) if len(ri) else last

    def __len__(self) -> int:
        return len(self.lengths)

    def _file(self, shard: int, layer: int) -> h5py.File:
        layer = _index(layer, self.n_layers, "layer")
        key = (shard, layer)
        if key not in self._files:
            path = layer_file(self.dirs[shard], layer)
            try:
                f = h5py.File(path, "r")
                off, attn = f["cell_offsets"][()], f.get("attn")
            except Exception as e:
                raise StoreError(f"{path}: cannot read the layer file ({type(e).__name__}: {e}); {REBUILD}") from None
            a, b = self.shard_starts[shard], self.shard_starts[shard + 1]
            want = self.stored_offsets[a : b + 1] - self.stored_offsets[a]
            if not np.array_equal(off, want) or (attn is not None and attn.shape != (self.n_heads, int(want[-1]))):
                f.close()
                raise StoreError(f"{path}: cell offsets or map shape do not match the token table; {REBUILD}")
            self._files[key] = f
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

    def _run(self, k_start, k_stop) -> tuple[int, int]:
        if k_stop is None:
            k_stop = len(self)
        for v in (k_start, k_stop):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"sequence index must be an integer, not {type(v).__name__} {v!r}")
        if not 0 <= k_start <= k_stop <= len(self):
            raise IndexError(
                f"sequences {k_start}..{k_stop} outside 0..{len(self)} (negative indices are not accepted)"
            )
        return int(k_start), int(k_stop)

    def _heads(self, heads):
        if heads is None:
            return slice(None)
        if isinstance(heads, slice):
            for v in (heads.start, heads.stop):
                if v is not None and not (isinstance(v, (int, np.integer)) and 0 <= v <= self.n_heads):
                    raise IndexError(
                        f"head slice {heads} outside 0..{self.n_heads} (negative indices are not accepted)"
                    )
            return heads
        return _index(heads, self.n_heads, "head")

    def _read(self, layer: int, k0: int, k1: int, heads=slice(None)) -> np.ndarray:
        """float32 cells [h, sum n^2] (or [sum n^2] for one head) of sequences k0..k1-1, checked."""
        layer = _index(layer, self.n_layers, "layer")
        if k0 == k1:
            return np.zeros((0,) if isinstance(heads, int) else (len(range(self.n_heads)[heads]), 0), dtype=np.float32)
        parts = []
        for s in range(len(self.dirs)):
            a, b = max(k0, int(self.shard_starts[s])), min(k1, int(self.shard_starts[s + 1]))
            if a >= b:
                continue
            f = self._file(s, layer)
            if "attn" not in f:
                raise StoreError(f"{f.filename}: no maps stored (extracted with maps: false)")
            base = self.stored_offsets[self.shard_starts[s]]
            lo, hi = int(self.stored_offsets[a] - base), int(self.stored_offsets[b] - base)
            part = np.asarray(f["attn"][heads, lo:hi], dtype=np.float32)
            if self.map_layout != "full":  # the same run is read for every layer: its index is kept
                if self._lower_index[0] != (a, b):
                    self._lower_index = ((a, b), lower_cells(self.lengths[a:b]))
                part = decode_cells(part, self.lengths[a:b], self.map_layout, self._lower_index[1])
            if self.check_values:
                seen = self._verified.setdefault(layer, np.zeros((self.n_heads, len(self)), dtype=bool))
                if not seen[heads, a:b].all():
                    self._check(part, layer, s, a, b, heads)
                    seen[heads, a:b] = True
            parts.append(part)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts, axis=-1)

    def _check(self, cells: np.ndarray, layer: int, shard: int, k0: int, k1: int, heads) -> None:
        starts = self._row_starts[self.token_offsets[k0] : self.token_offsets[k1]] - self.cell_offsets[k0]
        sums = np.add.reduceat(np.atleast_2d(cells), starts, axis=1) if cells.size else None
        faults = map_faults(cells, self.lengths[k0:k1], self.tolerance, starts=starts, sums=sums)
        if faults:
            row, k, q, what = faults[0]
            head = heads if isinstance(heads, int) else range(self.n_heads)[heads][row]
            k += k0
            raise StoreError(
                f"{layer_file(self.dirs[shard], layer)}: invalid attention map at head {head_label(layer, head)}, sequence {k} "
                f"(record {self.record_id[k]}), query row {q}: {what}; the file is damaged: {REBUILD}"
            )
        if heads == slice(None):  # kept for row_sums: the reading analysis often needs exactly these
            self._sums = (layer, k0, k1, sums)

    def row_sums(self, layer: int, k0: int, k1: int, cells: np.ndarray | None = None) -> np.ndarray:
        """Row sums [H, sum n] (``np.add.reduceat`` over each query row, float32) of the cells that
        :meth:`layer_cells` returns for the same arguments: those its value check computed when this
        run was the last one checked (no second pass over the cells), else computed here, from
        ``cells`` when given (that call's result), else from a read."""
        k0, k1 = self._run(k0, k1)
        layer = _index(layer, self.n_layers, "layer")
        if self._sums is not None and self._sums[:3] == (layer, k0, k1):
            return self._sums[3]
        cells = self._read(layer, k0, k1) if cells is None else cells
        if cells.shape[1] == 0:
            return np.zeros((self.n_heads, 0), dtype=np.float32)
        starts = self._row_starts[self.token_offsets[k0] : self.token_offsets[k1]] - self.cell_offsets[k0]
        return np.add.reduceat(cells, starts, axis=1)

    def tokens(self, k: int) -> dict[str, np.ndarray]:
        """The token table rows of sequence k."""
        k = _index(k, len(self), "sequence")
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
        k = _index(k, len(self), "sequence")
        block = self._read(layer, k, k + 1, self._heads(heads))
        n = int(self.lengths[k])
        return block.reshape(block.shape[:-1] + (n, n))

    def head(self, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """One head across all sequences: (flat float32 cells, cell offsets [N+1]).

        Sequence k's map is ``flat[off[k]:off[k+1]].reshape(n_k, n_k)``.
        """
        return self._read(layer, 0, len(self), _index(head, self.n_heads, "head")), self.cell_offsets

    def head_maps(self, layer: int, head: int) -> list[np.ndarray]:
        """One head across all sequences as a list of n x n views."""
        flat, off = self.head(layer, head)
        return [flat[off[k] : off[k + 1]].reshape(n, n) for k, n in enumerate(self.lengths)]

    def chunks(self, max_bytes: int) -> list[tuple[int, int]]:
        """Runs (k0, k1) of consecutive sequences whose maps of one layer (all heads, float32) fit
        in ``max_bytes`` (a run holds at least one sequence) and that never cross a shard
        boundary, so that :meth:`layer_cells` reads each run in one piece. Covers 0..N."""
        max_cells = max(1, int(max_bytes) // (4 * self.n_heads))
        return budget_runs(self.lengths**2, max_cells, self.shard_of)

    def layer_cells(self, layer: int, k0: int, k1: int) -> np.ndarray:
        """The flat float32 cells [H, sum n^2] of sequences k0..k1-1 at ``layer``, checked; sequence
        k's map of head h is ``cells[h, c[k]-c[k0] : c[k+1]-c[k0]].reshape(n, n)`` with
        c = :attr:`cell_offsets`. A run inside one shard (see :meth:`chunks`) is one read, no copy (a
        lower-triangle store: one read of half the bytes, then one scatter into the full maps)."""
        k0, k1 = self._run(k0, k1)
        return self._read(layer, k0, k1)

    def layer_maps(self, layer: int, k_start: int = 0, k_stop: int | None = None) -> list[np.ndarray]:
        """All heads of a run of sequences in one read per shard: list of [H, n, n]."""
        k_start, k_stop = self._run(k_start, k_stop)
        cells = self._read(layer, k_start, k_stop)
        off = self.cell_offsets[k_start : k_stop + 1] - self.cell_offsets[k_start]
        return [
            cells[:, off[i] : off[i + 1]].reshape(self.n_heads, n, n)
            for i, n in enumerate(self.lengths[k_start:k_stop].tolist())
        ]

    def _reps(self, layer: int, key: str) -> np.ndarray:
        layer = _index(layer, self.n_layers, "layer")
        parts = []
        for s in range(len(self.dirs)):
            f = self._file(s, layer)
            if key not in f:
                raise StoreError(f"{f.filename}: no {key} stored (extracted with reps: false)")
            x = f[key][()]
            want = self.manifests[s]["layers"].get(Path(f.filename).name, {}).get("data_" + CHECKSUM, {}).get(key)
            if self.check_values and want is not None and data_checksum(x) != want:
                raise StoreError(
                    f"{f.filename}: {key} differ from their {CHECKSUM} in the manifest; the file is damaged: {REBUILD}"
                )
            parts.append(x)
        return np.concatenate(parts)

    def head_vectors(self, layer: int) -> np.ndarray:
        """Per-head representations of every sequence at ``layer``: [N, H, d] float32."""
        return self._reps(layer, "head_vectors")

    def hidden(self, layer: int) -> np.ndarray:
        """The layer's hidden state at the representation position: [N, D] float32."""
        return self._reps(layer, "hidden")

    def word_maps(self, layer: int, k: int, mode: str = "mean") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Clark's word-level maps of sequence k: see :func:`word_level`."""
        t = self.tokens(k)
        return word_level(self.maps(layer, k), t["word"], t["special"], mode)


def verify_store(directory: str | Path) -> list[str]:
    """Every fault of one store directory, one line each ([] if none): manifest, checksums,
    token table, layer files and every map value (all heads, all sequences)."""
    directory = Path(directory)
    try:
        man = read_manifest(directory)
    except StoreError as e:
        return [str(e)]
    faults = []
    for name, entry in man["files"].items():
        want = entry.get(man.get("checksum", CHECKSUM))
        if want is not None and file_checksum(directory / name) != want:
            faults.append(
                f"{directory / name}: {man.get('checksum', CHECKSUM)} checksum differs from the manifest (contents changed); {REBUILD}"
            )
    unlisted = sorted(
        p.name
        for p in directory.iterdir()
        if not p.name.startswith(".")
        and p.name not in man["files"]
        and p.name != MANIFEST
        and not (p.name in NESTED and any(f.startswith(p.name + "/") for f in man["files"]))
    )
    if unlisted:
        faults.append(f"{directory}: files not in the manifest: {', '.join(unlisted)}")
    if (directory / NESTED[1]).is_dir():
        faults += verify_store(directory / NESTED[1])
    try:
        store = AttentionStore(directory)
    except StoreError as e:
        return faults + [str(e)]
    with store:
        for layer in range(store.n_layers):
            try:
                f = store._file(0, layer)
            except StoreError as e:
                faults.append(str(e))
                continue
            if "attn" in f:
                for k0, k1 in store.chunks(64 * 2**20):
                    cells = decode_cells(
                        np.asarray(
                            f["attn"][:, int(store.stored_offsets[k0]) : int(store.stored_offsets[k1])],
                            dtype=np.float32,
                        ),
                        store.lengths[k0:k1],
                        store.map_layout,
                    )
                    for row, k, q, what in map_faults(cells, store.lengths[k0:k1], store.tolerance, stop_at=20):
                        k += k0
                        faults.append(
                            f"{f.filename}: head {head_label(layer, row)}, sequence {k} (record {store.record_id[k]}), query row {q}: {what}"
                        )
            for key in ("head_vectors", "hidden"):
                if key in f:
                    bad = ~np.isfinite(f[key][()])
                    if bad.any():
                        k = int(np.argwhere(bad)[0][0])
                        faults.append(
                            f"{f.filename}: {int(bad.sum())} non-finite values in {key}, first at sequence {k} (record {store.record_id[k]})"
                        )
    return faults


def run_faults(root: str | Path) -> list[str]:
    """Every fault of a run directory (``results/``) or any directory below it: every attention store (all values,
    nested ``sample/`` stores), every corpus's set of shards, every sealed file and directory (full checksums),
    every sealable file without a seal."""
    faults: list[str] = []
    for d, names in walk_outputs(root):
        shards = [p.name for p in d.iterdir() if p.is_dir() and SHARD_NAME.fullmatch(p.name)]
        if shards and names is not None:
            faults += shard_set_faults(d, shards)
        if names is None:
            faults += verify_store(d) if (d / MANIFEST).is_file() else dir_problems(d, full=True)
            continue
        faults += [p for name in names if (p := file_problem(d / name, required=True))]
    return faults


def shard_set_faults(directory: Path, names: Sequence[str]) -> list[str]:
    """A corpus directory's shards: one count n and every shard 0..n-1 present."""
    found = [SHARD_NAME.fullmatch(n) for n in names]
    counts = sorted({int(m.group(2)) for m in found})
    if len(counts) != 1:
        return [f"{directory}: shards of different counts {counts} ({', '.join(sorted(names))}); {rebuild(directory)}"]
    n = counts[0]
    missing = sorted(set(range(n)) - {int(m.group(1)) for m in found})
    if missing:
        return [
            f"{directory}: incomplete set of shards: {', '.join(f'shard{i}of{n}' for i in missing)} missing; "
            "rerun snakemake to extract them"
        ]
    return []


def describe_store(directories: Sequence[str | Path]) -> dict:
    """What a store holds (after the cheap checks of opening it): model, corpus, shards,
    sequences, tokens, bytes, layout version."""
    with AttentionStore(directories) as st:
        m = st.meta
        return {
            "directories": [str(d) for d in st.dirs],
            "model": m.get("model"),
            "model_kind": m.get("model_kind"),
            "corpus": m.get("corpus"),
            "shards": [m2.get("shard") for m2 in st.metas],
            "n_shards": m.get("n_shards"),
            "layers": st.n_layers,
            "heads": st.n_heads,
            "sequences": len(st),
            "tokens": int(st.lengths.sum()),
            "cells_per_head": int(st.cell_offsets[-1]),
            "bytes": int(sum(e["size"] for man in st.manifests for e in man["files"].values())),
            "storage_dtype": m.get("storage_dtype"),
            "maps": all(man.get("maps", True) for man in st.manifests),  # what is on disk, not the meta's claim
            "maps_mode": m.get("maps_mode", "full" if m.get("maps", True) else "none"),
            "reps": m.get("reps"),
            "layout_version": st.manifests[0]["layout_version"],
            "map_layout": st.map_layout,
        }


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
    frm, to = unit_pooling(unit, len(unit_word), mode, maps.dtype)
    return frm @ maps @ to, unit_word, unit_special


def unit_pooling(unit: np.ndarray, u: int, mode: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(frm [u, n], to [n, u]) such that ``frm @ maps @ to`` is the unit-level map of :func:`word_level`: ``to``
    sums a unit's key columns, ``frm`` averages its query rows (``mean``) or takes its first one (``first``)."""
    n = len(unit)
    to = np.zeros((n, u), dtype=dtype)
    to[np.arange(n), unit] = 1.0
    if mode == "mean":
        frm = to.T / to.sum(axis=0)[:, None]
    else:
        frm = np.zeros((u, n), dtype=dtype)
        first = np.full(u, n)
        np.minimum.at(first, unit, np.arange(n))
        frm[np.arange(u), first] = 1.0
    return frm, to
