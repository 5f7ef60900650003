"""Batches of tokenized sequences for a model: length buckets, padded inputs, storage windows (shared by the
extraction, the fused feeds and every analysis that runs a model)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .data import TokenizedRecord
from .device import input_device
from .store import budget_runs


def storage_windows(lengths: np.ndarray, bytes_per_cell: int, budget: int) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of sequences whose n x n maps fit in ``budget`` bytes
    (at least one sequence each; none for no sequence)."""
    return budget_runs(np.asarray(lengths, dtype=np.int64) ** 2 * bytes_per_cell, budget)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Positions grouped into batches of similar length (stable sort by length)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def uses_token_types(model) -> bool:
    """Whether the model takes token type ids (BERT-style segment embeddings: ``type_vocab_size`` > 1)."""
    return getattr(model.config, "type_vocab_size", 0) > 1


def no_cache(model) -> dict:
    """``{"use_cache": False}`` where the model's forward takes it (decoders and BERT-style models; some encoders
    do not), else {}: a decoder's key/value cache would hold every layer's k and v to the end of the pass."""
    import inspect

    cls = type(model)
    if cls not in _CACHE_FLAG:
        _CACHE_FLAG[cls] = "use_cache" in inspect.signature(model.forward).parameters
    return {"use_cache": False} if _CACHE_FLAG[cls] else {}


_CACHE_FLAG: dict = {}


def pad_token(tokenizer) -> int:
    """The id that pads a batch (0 for a tokenizer without a pad token: padded positions are masked)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def model_inputs(batch: Sequence[TokenizedRecord], model, pad_id: int, extra_token: int | None = None) -> dict:
    """Right-padded tensors on the model's device, with token type ids where the model takes them
    (:func:`uses_token_types`). ``extra_token`` appends one real token after each sequence (decoders only: it
    changes no earlier position under the causal mask)."""
    import torch

    device = input_device(model)  # a split model's inputs go where its embeddings run

    add = 0 if extra_token is None else 1
    n = max(len(t) for t in batch) + add
    ids = np.full((len(batch), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), n), dtype=np.int64)
    types = np.zeros((len(batch), n), dtype=np.int64)
    for b, t in enumerate(batch):
        ids[b, : len(t)] = t.ids
        if add:
            ids[b, len(t)] = extra_token
        mask[b, : len(t) + add] = 1
        types[b, : len(t)] = t.segment
    inputs = {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask).to(device)}
    if uses_token_types(model):
        inputs["token_type_ids"] = torch.from_numpy(types).to(device)
    return inputs
