"""Batched attention extraction: tokenise, bucket by length, run the model, store maps."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .align import bos_id, encode_record
from .data import Counts, Record, TokenizedRecord
from .models import ModelError, ModelSpec, model_kind, package_versions
from .store import AttentionWriter

log = logging.getLogger("headatlas.extract")


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


def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Positions grouped into batches of similar length (stable sort by length)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


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
            raise ModelError(f"model {model_name!r}: layer {layer} attention has shape {shape}, expected [batch, {n_heads}, n, n]")


def model_inputs(batch: Sequence[TokenizedRecord], use_token_types: bool, pad_id: int, device) -> dict:
    import torch

    n = max(len(t) for t in batch)
    ids = np.full((len(batch), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), n), dtype=np.int64)
    types = np.zeros((len(batch), n), dtype=np.int64)
    for b, t in enumerate(batch):
        ids[b, : len(t)] = t.ids
        mask[b, : len(t)] = 1
        types[b, : len(t)] = t.segment
    inputs = {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask).to(device)}
    if use_token_types:
        inputs["token_type_ids"] = torch.from_numpy(types).to(device)
    return inputs


def forward_batches(model, tokenized: Sequence[TokenizedRecord], batch_size: int, n_layers: int, n_heads: int, name: str, pad_id: int) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """Yield (positions, per-layer [B, H, N, N] float32 arrays) for length-bucketed batches."""
    import torch

    use_types = getattr(model.config, "type_vocab_size", 0) > 1
    device = next(model.parameters()).device
    with torch.inference_mode():
        for pos in length_batches([len(t) for t in tokenized], batch_size):
            batch = [tokenized[p] for p in pos]
            out = model(**model_inputs(batch, use_types, pad_id, device), output_attentions=True)
            check_attentions(out.attentions, n_layers, n_heads, name)
            yield pos, [a.float().cpu().numpy() for a in out.attentions]


def model_shape(config) -> tuple[int, int]:
    return int(config.num_hidden_layers), int(config.num_attention_heads)


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
) -> Counts:
    """Extract and store the attention maps of ``records`` (one shard) for one model."""
    t0 = time.time()
    kind = model_kind(config, spec)
    bos = bos_id(tokenizer, spec.bos_token) if kind == "decoder" else None
    tokenized, counts = tokenize_records(records, tokenizer, kind, spec.max_length, overflow, bos, first_index)
    log.info(
        "model %s: %d records, %d sequences, %d skipped (longer than %d tokens), %d truncated",
        spec.name, counts["records"], counts["sequences"], counts["skipped_too_long"], spec.max_length, counts["truncated"],
    )
    if not tokenized:
        raise ModelError(f"model {spec.name!r}: every record is longer than max_length {spec.max_length}; nothing to extract")
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
    )
    ids = [records[t.record_index - first_index].id for t in tokenized]
    with AttentionWriter(out_dir, tokenized, ids, n_layers, n_heads, storage_dtype, full_meta) as writer:
        for pos, layers in forward_batches(model, tokenized, spec.batch_size, n_layers, n_heads, spec.name, pad_id):
            for layer, a in enumerate(layers):
                for b, p in enumerate(pos):
                    n = len(tokenized[p])
                    writer.write(int(p), layer, a[b, :, :n, :n])
    n_tok = sum(len(t) for t in tokenized)
    dt = time.time() - t0
    log.info("model %s: stored %d layers x %d heads for %d tokens in %.1f s (%.0f tokens/s)", spec.name, n_layers, n_heads, n_tok, dt, n_tok / max(dt, 1e-9))
    counts.add("tokens", n_tok)
    return counts
