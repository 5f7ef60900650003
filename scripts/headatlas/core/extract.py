"""Batched attention extraction: tokenise, bucket by length, run the model, store maps."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .align import encode_record
from .batching import length_batches, model_inputs, storage_windows
from .data import Counts, Record, TokenizedRecord
from .figures import head_label
from .mapfree import longest_of, open_feed
from .models import ModelError, ModelSpec, architecture, decoder_bos, model_kind, package_versions
from .progress import Progress
from .reduce import FeedInfo, ReduceBatch, SampleMaps, save_reduced
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


def check_attentions(attentions, n_layers: int, n_heads: int, model_name: str) -> None:
    if not attentions:
        raise ModelError(
            f"model {model_name!r} returned no attention probabilities; it must be loaded with "
            "attn_implementation='eager' and support output_attentions"
        )
    if len(attentions) != n_layers:
        raise ModelError(f"model {model_name!r} returned attention for {len(attentions)} layers, expected {n_layers}")
    for layer, a in enumerate(attentions):
        if a is None or a.dim() != 4 or a.shape[1] != n_heads:
            shape = None if a is None else tuple(a.shape)
            raise ModelError(
                f"model {model_name!r}: layer {layer + 1} attention has shape {shape}, expected [batch, {n_heads}, n, n]"
            )


def _head_output(model_type: str, name: str = "") -> re.Pattern:
    """The model type's head-output path (ARCHITECTURES) as a regex; group 1 = layer (or group) index."""
    path = architecture(model_type, name).head_output
    return re.compile(r"(?:^|\.)" + re.escape(path).replace(re.escape("{layer}"), r"(\d+)") + "$")


def head_output_modules(model, n_layers: int, name: str = "") -> list:
    """Per layer, the attention output projection (its row in ARCHITECTURES); its input is
    the concatenated per-head context vectors sum_j A_ij v_j (heads in head-major order). A
    model whose layers share weights (ALBERT) gets the same module for every layer of a group."""
    mt = model.config.model_type
    pattern = _head_output(mt, name)
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


def rep_positions(batch: Sequence[TokenizedRecord], kind: str, position: str) -> np.ndarray:
    """Where a sequence's per-head representation is read: [CLS] (0) for encoders; for
    decoders the last real token, or one past it ('past_last', the reference code's choice)."""
    if kind == "encoder":
        return np.zeros(len(batch), dtype=np.int64)
    lengths = np.array([len(t) for t in batch])
    return lengths if position == "past_last" else lengths - 1


def forward_batches(
    model,
    tokenized: Sequence[TokenizedRecord],
    batch_size: int,
    n_layers: int,
    n_heads: int,
    name: str,
    pad_id: int,
    attentions: bool = True,
    reps: bool = False,
    kind: str = "encoder",
    rep_position: str = "last",
    before=None,
) -> Iterator[tuple[np.ndarray, list[np.ndarray] | None, tuple[list[np.ndarray], list[np.ndarray]] | None]]:
    """Yield (positions, per-layer [B, H, N, N] maps or None, (per-layer [B, H, d] head vectors,
    per-layer [B, D] hidden states) or None) for length-bucketed batches. ``before(positions)`` is called
    before each forward pass (a fused feed sets its batch there)."""
    import torch

    use_types = getattr(model.config, "type_vocab_size", 0) > 1
    device = next(model.parameters()).device
    captured: list = []
    hooks = []
    if reps:

        def hook(module, args):
            captured.append(args[0])

        # called in layer order; a module shared by several layers (ALBERT) once per layer
        hooks = [m.register_forward_pre_hook(hook) for m in dict.fromkeys(head_output_modules(model, n_layers, name))]
    extra = pad_id if (reps and kind == "decoder" and rep_position == "past_last") else None
    try:
        with torch.inference_mode():
            for pos in length_batches([len(t) for t in tokenized], batch_size):
                batch = [tokenized[p] for p in pos]
                inputs = model_inputs(batch, use_types, pad_id, device, extra_token=extra)
                if before is not None:
                    before(pos)
                captured.clear()
                out = model(**inputs, output_attentions=attentions, output_hidden_states=reps)
                maps = None
                if attentions:
                    check_attentions(out.attentions, n_layers, n_heads, name)
                    maps = [a.float().cpu().numpy() for a in out.attentions]
                vectors = None
                if reps:
                    if len(captured) != n_layers:
                        raise ModelError(
                            f"model {name!r}: the attention output projection ran {len(captured)} times, expected {n_layers}"
                        )
                    at = torch.as_tensor(rep_positions(batch, kind, rep_position), device=device)
                    rows = torch.arange(len(batch), device=device)
                    heads = [c[rows, at].reshape(len(batch), n_heads, -1).float().cpu().numpy() for c in captured]
                    hidden = [h[rows, at].float().cpu().numpy() for h in out.hidden_states[1:]]
                    vectors = (heads, hidden)
                yield pos, maps, vectors
    finally:
        for h in hooks:
            h.remove()


def model_shape(config) -> tuple[int, int]:
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def rep_shapes(model, n_layers: int, n_heads: int) -> tuple[int, int]:
    """(head_dim, hidden size) of the stored representations."""
    proj = head_output_modules(model, n_layers)[0]
    # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out]
    width = proj.weight.shape[0] if architecture(model.config.model_type).conv1d else proj.weight.shape[1]
    return width // n_heads, int(model.config.hidden_size)


def extract(
    records: Sequence[Record],
    spec: ModelSpec,
    model,
    tokenizer,
    config,
    out_dir: str | Path,
    storage_dtype: str = "float32",
    overflow: str = "skip",
    first_index: int = 0,
    meta: dict | None = None,
    maps: bool = True,
    reps: bool = True,
    rep_position: str = "last",
    buffer_bytes: int = 64 * 2**20,
    reducers: Sequence | None = None,
    sample: Sequence[int] | None = None,
    corpus_records: Sequence[Record] | None = None,
    attention: str = "auto",
) -> Counts:
    """Extract and store the attention maps (``maps``) and per-head representations
    (``reps``) of ``records`` (one shard) for one model.

    Sequences are processed in windows of consecutive records whose maps fit in
    ``buffer_bytes``; within a window, batches are bucketed by length.

    Fused (``reducers`` given, ``maps`` off): the same forward pass also feeds every layer's attention to
    ``reducers`` (:class:`headatlas.core.reduce.FusedFeed`, or without maps when every reducer has a map-free
    form and no sample is kept: :func:`headatlas.core.mapfree.plan_feed`) and writes their results to ``reduced/<name>.h5``,
    and the maps of the sequences of the records ``sample`` (corpus record indices; None: no sample) to
    the nested store ``sample/``; all inside the output directory, which appears only when complete.
    ``corpus_records`` (the whole corpus, indexed by record index, with the trees the reducers use)
    reach the reducers; default ``records``. ``attention``: the feed's path (auto | eager | mapfree,
    :func:`headatlas.core.mapfree.plan_feed`)."""
    if rep_position not in ("last", "past_last"):
        raise ValueError(f"rep_position must be 'last' or 'past_last', not {rep_position!r}")
    fused = reducers is not None
    if fused and maps:
        raise ValueError("a fused extraction stores no full maps: maps must be off (maps: sample or none)")
    if not (maps or reps or fused):
        raise ValueError("nothing to extract: maps and reps are both off")
    t0 = time.perf_counter()
    kind = model_kind(config, spec)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, counts = tokenize_records(records, tokenizer, kind, spec.max_length, overflow, bos, first_index)
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
        raise ModelError(
            f"model {spec.name!r}: every record is longer than max_length {spec.max_length}; nothing to extract"
        )
    if not records:  # a shard of a corpus split in more shards than it has records: a valid empty store
        log.warning("model %s: no record in this shard; writing an empty store", spec.name)
    n_layers, n_heads = model_shape(config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    full_meta = dict(
        meta or {},
        model=spec.name,
        source=spec.source,
        model_kind=kind,
        model_type=config.model_type,
        compute_dtype=spec.dtype,
        max_length=spec.max_length,
        overflow=overflow,
        tokenizer=type(tokenizer).__name__,
        bos_id=bos,
        counts=counts.values,
        versions=package_versions(),
        maps=maps,
        maps_mode="full" if maps else ("sample" if sample is not None else "none"),
        reps=reps,
        rep_position=("cls" if kind == "encoder" else rep_position) if reps else None,
    )
    ids = [records[t.record_index - first_index].id for t in tokenized]
    shapes = rep_shapes(model, n_layers, n_heads) if reps else None
    lengths = np.array([len(t) for t in tokenized])
    store_dtype = np.dtype(storage_dtype)
    tol = row_sum_tolerance({"storage_dtype": str(store_dtype), "compute_dtype": spec.dtype})

    def write_window(writer, start, stop, buf, head_buf, hidden_buf):
        for layer in range(n_layers):
            if maps:
                # the readers' value check, at the source: a model whose maps are not distributions fails here
                for head, k, q, what in map_faults(buf[layer], lengths[start:stop], tol):
                    raise ModelError(
                        f"model {spec.name!r}: head {head_label(layer, head)}, record {ids[start + k]}, query row {q}: attention {what}"
                    )
                writer.write_cells(start, stop, layer, buf[layer])
            if reps:
                writer.write_reps(np.arange(start, stop), layer, head_buf[layer], hidden_buf[layer])

    head_buf = hidden_buf = None
    feed = None
    if fused:
        if corpus_records is None:
            corpus_records = [None] * first_index + list(records)
        info = FeedInfo(
            len(tokenized),
            n_layers,
            n_heads,
            spec.name,
            kind,
            (meta or {}).get("corpus", ""),
            np.asarray(ids),
            first_index,
        )
    # A window is written by a background thread while the next one is computed (at most one
    # write in flight, so two windows in memory); the writer's exit still sees every write.
    map_layout = "lower" if kind == "decoder" else "full"  # causal maps: their lower triangle (also the sample's)
    with (
        AttentionWriter(
            out_dir,
            tokenized,
            ids,
            n_layers,
            n_heads,
            storage_dtype,
            full_meta,
            maps=maps,
            rep_shapes=shapes,
            map_layout=map_layout,
        ) as writer,
        ThreadPoolExecutor(1) as io,
        contextlib.ExitStack() as stack,
    ):
        if fused:
            keep = []
            if sample is not None:
                keep_pos = np.flatnonzero(
                    np.isin([t.record_index for t in tokenized], np.asarray(sample, dtype=np.int64))
                )
                sample_writer = stack.enter_context(
                    AttentionWriter(
                        writer.tmp / "sample",
                        [tokenized[k] for k in keep_pos],
                        [ids[k] for k in keep_pos],
                        n_layers,
                        n_heads,
                        storage_dtype,
                        dict(
                            full_meta,
                            maps=True,
                            maps_mode="full",
                            sample_of=len(tokenized),
                            reps=False,
                            rep_position=None,
                        ),
                        maps=True,
                        map_layout=map_layout,
                    )
                )
                keep = [SampleMaps(keep_pos, sample_writer, tol)]
            feed = stack.enter_context(open_feed(model, list(reducers) + keep, info, longest_of(tokenized), attention))
        m = meta or {}  # progress names the model, the corpus and (when split) the shard
        shard = f"shard{m['shard']}of{m['n_shards']}" if m.get("n_shards", 1) > 1 else ""
        what = " ".join(filter(None, ["extract", spec.name, m.get("corpus"), shard]))
        pending, done = None, Progress(int(lengths.sum()), what, "tokens")
        for start, stop in storage_windows(lengths, n_layers * n_heads * store_dtype.itemsize, buffer_bytes):
            # one window of consecutive sequences is bucketed by length, run, and written as one block per layer
            window = tokenized[start:stop]
            cell_off = writer.cell_offsets[start : stop + 1] - writer.cell_offsets[start]
            buf = [np.empty((n_heads, int(cell_off[-1])), dtype=store_dtype) for _ in range(n_layers)] if maps else None
            if reps:
                head_buf = [np.empty((stop - start, n_heads, shapes[0]), dtype=np.float32) for _ in range(n_layers)]
                hidden_buf = [np.empty((stop - start, shapes[1]), dtype=np.float32) for _ in range(n_layers)]
            before = None
            if feed is not None:

                def before(pos, start=start):
                    feed.begin(ReduceBatch.from_tokenized(tokenized, start + pos, corpus_records))

            batches = forward_batches(
                model,
                window,
                spec.batch_size,
                n_layers,
                n_heads,
                spec.name,
                pad_id,
                maps,
                reps,
                kind,
                rep_position,
                before,
            )
            for pos, layers, vectors in done.iter(batches, lambda b, s=start: lengths[s + b[0]].sum()):
                if feed is not None:
                    feed.end()
                for layer in range(n_layers):
                    if maps:
                        for b, p in enumerate(pos):
                            n = int(lengths[start + p])
                            buf[layer][:, cell_off[p] : cell_off[p + 1]] = layers[layer][b, :, :n, :n].reshape(
                                n_heads, n * n
                            )
                    if reps:
                        head_buf[layer][pos] = vectors[0][layer]
                        hidden_buf[layer][pos] = vectors[1][layer]
            if pending is not None:
                pending.result()
            pending = io.submit(write_window, writer, start, stop, buf, head_buf, hidden_buf)
        if pending is not None:
            pending.result()
        if feed is not None:
            for r, result in zip(reducers, feed.results()):
                save_reduced(
                    writer.tmp,
                    r,
                    result,
                    {"model": spec.name, "corpus": info.corpus, "shard": (meta or {}).get("shard")},
                )
    n_tok = sum(len(t) for t in tokenized)
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
