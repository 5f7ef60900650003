"""Batched attention extraction: tokenise, bucket by length, run the model once, and let reducers write.

One forward loop (:func:`headatlas.core.reduce.forward_loop`) drives every extraction: the stored maps
(``maps: full``, :class:`~headatlas.core.reduce.LayerMaps` filling the window's buffers), the per-head
representations (:class:`HeadReps`), the fused statistics of a ``sample`` / ``none`` corpus and its sample's
maps (:class:`~headatlas.core.reduce.SampleMaps`) are all reducers of one feed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .align import encode_record
from .batching import length_batches, pad_token, storage_windows
from .data import Counts, Record, TokenizedRecord
from .figures import head_label
from .mapfree import PATHS, longest_of
from .models import ModelError, ModelSpec, architecture, decoder_bos, model_kind, package_versions
from .progress import Progress
from .reduce import (
    FeedInfo,
    FusedFeed,
    LayerMaps,
    ReduceBatch,
    Reducer,
    SampleMaps,
    feed_record,
    forward_loop,
    open_feed,
    save_reduced,
)
from .store import AttentionWriter, map_faults, row_sum_tolerance

log = logging.getLogger("headatlas.core.extract")


def config_hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shard_slice(n: int, shard: int, n_shards: int) -> slice:
    """Contiguous block ``shard`` of ``n_shards`` over n records (concatenation restores order)."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} outside 0..{n_shards - 1}")
    return slice(shard * n // n_shards, (shard + 1) * n // n_shards)


def tokenize_records(
    records: Sequence[Record],
    tokenizer,
    kind: str,
    max_length: int,
    overflow: str = "skip",
    bos: int | None = None,
    first_index: int = 0,
) -> tuple[list[TokenizedRecord], Counts]:
    counts = Counts()
    out = []
    for i, r in enumerate(records):
        t = encode_record(r, tokenizer, kind, max_length, overflow, bos, record_index=first_index + i)
        counts.add("records")
        if t is None:
            counts.add("skipped_too_long")
            continue
        if t.truncated:
            counts.add("truncated")
        out.append(t)
    counts.add("sequences", len(out))
    return out, counts


def head_output_pattern(model_type: str, name: str = "") -> re.Pattern:
    """The model type's head-output path (ARCHITECTURES) as a regex; group 1 = layer (or group) index."""
    path = architecture(model_type, name).head_output
    return re.compile(r"(?:^|\.)" + re.escape(path).replace(re.escape("{layer}"), r"(\d+)") + "$")


def head_output_modules(model, n_layers: int, name: str = "") -> list:
    """Per layer, the attention output projection (its row in ARCHITECTURES); its input is
    the concatenated per-head context vectors sum_j A_ij v_j (heads in head-major order). A
    model whose layers share weights (ALBERT) gets the same module for every layer of a group."""
    mt = model.config.model_type
    pattern = head_output_pattern(mt, name)
    found = {}
    for mod_name, module in model.named_modules():
        m = pattern.search(mod_name)
        if m:
            found[int(m.group(1))] = module
    n_mod = n_layers if not architecture(mt).shared_layers else len(found)
    if not found or sorted(found) != list(range(n_mod)) or n_layers % n_mod:
        raise ModelError(
            f"model {name!r} ({mt}): cannot find the attention output projection {pattern.pattern!r} of every layer "
            f"(found {sorted(found)} for {n_layers} layers)"
        )
    return [found[i * n_mod // n_layers] for i in range(n_layers)]


def rep_positions(lengths: np.ndarray, kind: str, position: str) -> np.ndarray:
    """Where a sequence of ``lengths`` tokens has its per-head representation read: [CLS] (0) for encoders; for
    decoders the last real token, or one past it ('past_last', the reference code's choice)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if kind == "encoder":
        return np.zeros(len(lengths), dtype=np.int64)
    return lengths if position == "past_last" else lengths - 1


class HeadOutputHooks(Reducer):
    """Not a statistic by itself: the base of reducers that read every layer's head outputs (the input of the
    attention output projection, :func:`head_output_modules`, by forward pre-hooks) and the model's outputs.
    Served by either feed (the hooks read whatever attention ran); :meth:`take` hands over one batch's layers,
    each ``capture(x)`` of the projection's input ``x`` [B, n, H * d]."""

    needs_outputs = True
    needs_maps = False

    def __init__(self, model):
        self.model = model
        self.hooks: list = []
        self.captured: list = []

    def capture(self, x):
        return x

    def start(self, info: FeedInfo) -> None:
        super().start(info)
        modules = head_output_modules(self.model, info.n_layers, info.model)
        # called in layer order; a module shared by several layers (ALBERT) once per layer
        self.hooks = [m.register_forward_pre_hook(self._hook) for m in dict.fromkeys(modules)]

    def _hook(self, module, args) -> None:
        self.captured.append(self.capture(args[0]))

    def stop(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks, self.captured = [], []

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        pass

    def take(self) -> list:
        """The layers captured since the last call, one per layer (else a ModelError)."""
        captured, self.captured = self.captured, []
        if len(captured) != self.info.n_layers:
            raise ModelError(
                f"model {self.info.model!r}: the attention output projection ran {len(captured)} times, "
                f"expected {self.info.n_layers}"
            )
        return captured


class HeadReps(HeadOutputHooks):
    """Not a statistic: each sequence's per-head context vectors (:class:`HeadOutputHooks`) and hidden states
    (the model's output) at its representation position (:func:`rep_positions`), handed per batch to
    ``sink(batch, heads, hidden)``: per layer [B, H, d] and [B, D] float32 numpy."""

    name = "head_reps"

    def __init__(self, model, kind: str, rep_position: str, sink):
        super().__init__(model)
        self.kind, self.rep_position, self.sink = kind, rep_position, sink

    def update_outputs(self, outputs, batch: ReduceBatch) -> None:
        import torch

        captured, info = self.take(), self.info
        device = captured[0].device
        at = torch.as_tensor(rep_positions(batch.lengths, self.kind, self.rep_position), device=device)
        rows = torch.arange(len(batch), device=device)
        on = lambda x: (rows.to(x.device), at.to(x.device))  # noqa: E731  (a split model's layers: their own devices)
        heads = [c[on(c)].reshape(len(batch), info.n_heads, -1).float().cpu().numpy() for c in captured]
        hidden = [h[on(h)].float().cpu().numpy() for h in outputs.hidden_states[1:]]
        self.sink(batch, heads, hidden)

    def result(self):
        return None


def model_shape(config) -> tuple[int, int]:
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def rep_shapes(model, n_layers: int, n_heads: int) -> tuple[int, int]:
    """(head_dim, hidden size) of the stored representations."""
    proj = head_output_modules(model, n_layers)[0]
    # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out]
    width = proj.weight.shape[0] if architecture(model.config.model_type).conv1d else proj.weight.shape[1]
    return width // n_heads, int(model.config.hidden_size)


class StoreWindow:
    """The stored maps and representations of one window of consecutive sequences (:meth:`open`), filled by
    writer reducers of the extraction's feed (:meth:`reducers`: :class:`~headatlas.core.reduce.LayerMaps` and
    :class:`HeadReps`) and written as one block per layer (:meth:`write` of what :meth:`take` hands over,
    in a background thread while the next window is computed). Each map is checked at the source: a model
    whose maps are not distributions (within ``tol``) fails naming the head, record and row."""

    def __init__(self, writer: AttentionWriter, model_name: str, ids: Sequence[str], tol: float):
        self.writer, self.model_name, self.ids, self.tol = writer, model_name, ids, tol
        self.n_layers, self.n_heads, self.dtype, self.lengths = (
            writer.n_layers,
            writer.n_heads,
            writer.dtype,
            writer.lengths,
        )
        self.maps, self.reps = writer.store_maps, writer.rep_shapes
        self.buf: dict = {}

    def reducers(self, model, kind: str, rep_position: str) -> list:
        return ([LayerMaps(self.put_maps)] if self.maps else []) + (
            [HeadReps(model, kind, rep_position, self.put_reps)] if self.reps else []
        )

    def open(self, start: int, stop: int) -> None:
        cells = self.writer.cell_offsets[start : stop + 1] - self.writer.cell_offsets[start]
        L, H = self.n_layers, self.n_heads
        self.buf = {"start": start, "stop": stop, "cells": cells}
        if self.maps:
            self.buf["maps"] = [np.empty((H, int(cells[-1])), dtype=self.dtype) for _ in range(L)]
        if self.reps:
            d, dim = self.reps
            self.buf["heads"] = [np.empty((stop - start, H, d), dtype=np.float32) for _ in range(L)]
            self.buf["hidden"] = [np.empty((stop - start, dim), dtype=np.float32) for _ in range(L)]

    def put_maps(self, layer: int, attn, batch: ReduceBatch) -> None:
        a = attn.float().cpu().numpy()
        off, buf = self.buf["cells"], self.buf["maps"][layer]
        for b, p in enumerate((batch.seq - self.buf["start"]).tolist()):
            n = int(batch.lengths[b])
            buf[:, off[p] : off[p + 1]] = a[b, :, :n, :n].reshape(self.n_heads, n * n)

    def put_reps(self, batch: ReduceBatch, heads: list, hidden: list) -> None:
        pos = batch.seq - self.buf["start"]
        for layer in range(self.n_layers):
            self.buf["heads"][layer][pos] = heads[layer]
            self.buf["hidden"][layer][pos] = hidden[layer]

    def take(self) -> dict:
        buf, self.buf = self.buf, {}
        return buf

    def write(self, buf: dict) -> None:
        start, stop = buf["start"], buf["stop"]
        for layer in range(self.n_layers):
            if self.maps:
                # the readers' value check, at the source: a model whose maps are not distributions fails here
                for head, k, q, what in map_faults(buf["maps"][layer], self.lengths[start:stop], self.tol):
                    raise ModelError(
                        f"model {self.model_name!r}: head {head_label(layer, head)}, record {self.ids[start + k]}, query row {q}: attention {what}"
                    )
                self.writer.write_cells(start, stop, layer, buf["maps"][layer])
            if self.reps:
                self.writer.write_reps(np.arange(start, stop), layer, buf["heads"][layer], buf["hidden"][layer])


@dataclass(frozen=True, kw_only=True)
class ExtractSettings:
    """How an extraction runs and what it stores (the workflow's ``extraction_params``): the stored maps' dtype,
    what happens to a record longer than the model's max_length (``overflow``: skip | truncate), whether every
    map (``maps``) and the per-head representations (``reps``, read at ``rep_position``: last | past_last for
    decoders) are stored, the bytes of maps buffered per write window, and the attention path of a fused
    extraction (auto | eager | mapfree, :func:`headatlas.core.mapfree.plan_feed`)."""

    storage_dtype: str = "float32"
    overflow: str = "skip"
    maps: bool = True
    reps: bool = True
    rep_position: str = "last"
    buffer_bytes: int = 64 * 2**20
    attention: str = "auto"
    cpu_pass: str = "auto"

    def __post_init__(self):
        if self.rep_position not in ("last", "past_last"):
            raise ValueError(f"rep_position must be 'last' or 'past_last', not {self.rep_position!r}")
        if self.attention not in PATHS:
            raise ValueError(f"attention path must be one of {PATHS}, not {self.attention!r}")
        if self.cpu_pass not in ("auto", "off"):
            raise ValueError(f"cpu_pass must be auto or off, not {self.cpu_pass!r}")


def store_meta(
    meta: dict, spec: ModelSpec, config, tokenizer, kind: str, bos, counts: Counts, s: ExtractSettings, sampled: bool
) -> dict:
    """The store's metadata (meta.json): ``meta`` and what the extraction was run with."""
    return dict(
        meta,
        model=spec.name,
        source=spec.source,
        model_kind=kind,
        model_type=config.model_type,
        compute_dtype=spec.dtype,
        max_length=spec.max_length,
        overflow=s.overflow,
        tokenizer=type(tokenizer).__name__,
        bos_id=bos,
        counts=counts.values,
        versions=package_versions(),
        maps=s.maps,
        maps_mode="full" if s.maps else ("sample" if sampled else "none"),
        reps=s.reps,
        rep_position=("cls" if kind == "encoder" else s.rep_position) if s.reps else None,
    )


def extract(
    records: Sequence[Record],
    spec: ModelSpec,
    model,
    tokenizer,
    config,
    out_dir: str | Path,
    settings: ExtractSettings = ExtractSettings(),
    first_index: int = 0,
    meta: dict | None = None,
    reducers: Sequence[Reducer] | None = None,
    sample: Sequence[int] | None = None,
    corpus_records: Sequence[Record] | None = None,
) -> Counts:
    """Extract ``records`` (one shard, the first of them record ``first_index`` of the corpus) for one model
    into the store ``out_dir``, which appears only when complete: the attention maps and per-head
    representations as ``settings`` say (:class:`ExtractSettings`), ``meta`` in the store's metadata.

    One forward pass per batch feeds every reducer (:func:`headatlas.core.reduce.forward_loop`): the stored maps
    and representations (written per window of consecutive records whose maps fit ``settings.buffer_bytes``;
    within a window, batches are bucketed by length) and, fused (``reducers`` given, ``maps`` off), the
    statistics of ``reducers`` (:class:`~headatlas.core.reduce.FusedFeed`, or without maps when every reducer
    has a map-free form and ``settings.attention`` allows it, :func:`headatlas.core.mapfree.plan_feed`), saved
    as ``reduced/<name>.h5``, and the maps of the sequences of the records ``sample`` (corpus record indices;
    None: no sample) in the nested store ``sample/``. ``corpus_records`` (the whole corpus, indexed by record
    index, with the trees the reducers use) reach the reducers; default ``records``."""
    s = settings
    fused = reducers is not None
    if fused and s.maps:
        raise ValueError("a fused extraction stores no full maps: maps must be off (maps: sample or none)")
    if not (s.maps or s.reps or fused):
        raise ValueError("nothing to extract: maps and reps are both off")
    t0 = time.perf_counter()
    kind = model_kind(config, spec)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, counts = tokenize_records(records, tokenizer, kind, spec.max_length, s.overflow, bos, first_index)
    log.info(
        "model %s: %d records, %d sequences, %d skipped (longer than %d tokens), %d truncated",
        spec.name,
        counts["records"],
        counts["sequences"],
        counts["skipped_too_long"],
        spec.max_length,
        counts["truncated"],
    )
    if records and not tokenized:
        # the corpus fails only when none of its records fits, whatever its shard count: a shard whose every
        # record is skipped is an empty store when a record of another shard fits (stops at the first)
        shard = range(first_index, first_index + len(records))
        rest = (r for i, r in enumerate(corpus_records or ()) if r is not None and i not in shard)
        if not any(encode_record(r, tokenizer, kind, spec.max_length, s.overflow, bos) is not None for r in rest):
            how = "not even the first word of any record fits" if s.overflow == "truncate" else "overflow: skip"
            raise ModelError(
                f"model {spec.name!r}: every record is longer than max_length {spec.max_length} ({how}); nothing to "
                "extract"
            )
        log.warning(
            "model %s: every record of this shard (%d) is longer than %d tokens and skipped; writing an empty store",
            spec.name,
            len(records),
            spec.max_length,
        )
    if not records:  # a shard of a corpus split in more shards than it has records: a valid empty store
        log.warning("model %s: no record in this shard; writing an empty store", spec.name)
    n_layers, n_heads = model_shape(config)
    pad_id = pad_token(tokenizer)
    m = meta or {}
    full_meta = store_meta(m, spec, config, tokenizer, kind, bos, counts, s, sample is not None)
    ids = [records[t.record_index - first_index].id for t in tokenized]
    shapes = rep_shapes(model, n_layers, n_heads) if s.reps else None
    lengths = np.array([len(t) for t in tokenized])
    store_dtype = np.dtype(s.storage_dtype)
    tol = row_sum_tolerance({"storage_dtype": str(store_dtype), "compute_dtype": spec.dtype})
    if corpus_records is None:
        corpus_records = [None] * first_index + list(records)
    info = FeedInfo(
        len(tokenized), n_layers, n_heads, spec.name, kind, m.get("corpus", ""), np.asarray(ids), first_index
    )
    # A window is written by a background thread while the next one is computed (at most one
    # write in flight, so two windows in memory); the writer's exit still sees every write.
    cell_bytes = n_layers * n_heads * store_dtype.itemsize
    map_layout = "lower" if kind == "decoder" else "full"  # causal maps: their lower triangle (also the sample's)
    with (
        AttentionWriter(
            out_dir,
            tokenized,
            ids,
            n_layers,
            n_heads,
            s.storage_dtype,
            full_meta,
            maps=s.maps,
            rep_shapes=shapes,
            map_layout=map_layout,
        ) as writer,
        ThreadPoolExecutor(1) as io,
        contextlib.ExitStack() as stack,
    ):
        keep = []
        if fused and sample is not None:
            keep_pos = np.flatnonzero(np.isin([t.record_index for t in tokenized], np.asarray(sample, dtype=np.int64)))
            sample_writer = stack.enter_context(
                AttentionWriter(
                    writer.tmp / "sample",
                    [tokenized[k] for k in keep_pos],
                    [ids[k] for k in keep_pos],
                    n_layers,
                    n_heads,
                    s.storage_dtype,
                    dict(
                        full_meta, maps=True, maps_mode="full", sample_of=len(tokenized), reps=False, rep_position=None
                    ),
                    maps=True,
                    map_layout=map_layout,
                )
            )
            keep = [SampleMaps(keep_pos, sample_writer, tol)]
        window = StoreWindow(writer, spec.name, ids, tol)
        writers = window.reducers(model, kind, s.rep_position)  # the stored maps and representations
        if fused:  # the statistics on the cheapest path that serves them (plan_feed)
            feed = open_feed(
                model, writers + list(reducers) + keep, info, longest_of(tokenized), s.attention, s.cpu_pass
            )
        else:  # the model as loaded; the stored maps from its output, as transformers returns them for every type
            feed = FusedFeed(model, writers, info, source="outputs")
        stack.enter_context(feed)
        extra = pad_id if (s.reps and kind == "decoder" and s.rep_position == "past_last") else None
        shard = f"shard{m['shard']}of{m['n_shards']}" if m.get("n_shards", 1) > 1 else ""
        what = " ".join(filter(None, ["extract", spec.name, m.get("corpus"), shard]))  # the model, corpus, shard
        pending, done = None, Progress(int(lengths.sum()), what, "tokens")
        for start, stop in storage_windows(lengths, cell_bytes, s.buffer_bytes):
            # one window of consecutive sequences is bucketed by length, run, and written as one block per layer
            window.open(start, stop)
            batches = [start + pos for pos in length_batches(lengths[start:stop], spec.batch_size)]
            for _ in done.iter(forward_loop(model, tokenized, batches, feed, corpus_records, pad_id, extra),
                               lambda pos: lengths[pos].sum()):  # fmt: skip
                pass
            if pending is not None:
                pending.result()
            pending = io.submit(window.write, window.take())
        if pending is not None:
            pending.result()
        if fused:  # what computed the statistics: the path and the kernels that ran
            writer.meta["attention"] = feed_record(feed)
        for r in reducers or []:
            save_reduced(
                writer.tmp,
                r,
                r.result(),
                {"model": spec.name, "corpus": info.corpus, "shard": m.get("shard"), "attention": feed_record(feed)},
            )
    n_tok = int(lengths.sum())
    dt = time.perf_counter() - t0
    log.info(
        "model %s: stored %d layers x %d heads for %d tokens in %.1f s (%.0f tokens/s)",
        spec.name,
        n_layers,
        n_heads,
        n_tok,
        dt,
        n_tok / max(dt, 1e-9),
    )
    counts.add("tokens", n_tok)
    return counts
