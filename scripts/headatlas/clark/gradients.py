"""Gradient importance of attention (Clark et al. 2019, Fig. 3).

The mean |dL/dA_ij| per layer, grouped by the key token's type, where L is the language-model
loss of the model's own LM head:

- encoders with a masked-LM head: BERT-style masking of 15% of the non-special tokens (80% [MASK],
  10% a random token, 10% unchanged), loss on the masked positions only;
- decoders: the causal LM loss (every real token after the first is a target).

The loss of a batch is the sum of its sequences' mean token losses, so every sequence's gradients
are those it would get alone. The attention probabilities returned by an eager forward pass in
eval mode are the tensors multiplied with the values (dropout is the identity), so
``retain_grad`` on them gives dL/dA. Cells a query may not attend to (padding; j > i under a
causal mask) are left out of the averages: their gradient is not zero (it is dL/dO_i . v_j) but
it belongs to no attention weight the model can use.

Key types: ``sep_bos`` ([SEP] for encoders; BOS for decoders, whose attention sink plays the
no-op part the paper gives [SEP]), ``punct`` (". ,"), ``cls`` ([CLS], encoders only; the paper
does not say where it counted [CLS]) and ``other``.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pandas as pd

from ..core.batching import length_batches, model_inputs, pad_token
from ..core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, TokenizedRecord
from ..core.device import input_device, job_device
from ..core.extract import tokenize_records
from ..core.models import (
    decoder_bos,
    lm_head_model,
    model_kind,
    resolve,
    word_embeddings,
)
from ..core.progress import progress
from .surface import punct_mask

log = logging.getLogger("headatlas.clark.gradients")

KEY_TYPES = ["sep_bos", "punct", "cls", "other"]
COLUMNS = [
    "model",
    "model_kind",
    "status",
    "reason",
    "loss_kind",
    "layer",
    "key_type",
    "mean_abs_grad",
    "n_cells",
    "n_sequences",
    "mean_loss",
]


def key_types(special: np.ndarray, piece: Sequence[str], causal: bool) -> np.ndarray:
    """Index into :data:`KEY_TYPES` of every token of one sequence."""
    special = np.asarray(special)
    out = np.full(len(special), KEY_TYPES.index("other"), dtype=np.int64)
    out[punct_mask(piece, special)] = KEY_TYPES.index("punct")
    if causal:
        out[special == SPECIAL_BOS] = KEY_TYPES.index("sep_bos")
    else:
        out[special == SPECIAL_SEP] = KEY_TYPES.index("sep_bos")
        out[special == SPECIAL_CLS] = KEY_TYPES.index("cls")
    return out


def mlm_inputs(
    ids: np.ndarray, special: np.ndarray, rng: np.random.Generator, mask_prob: float, mask_id: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """BERT-style masking of one sequence: (input ids, labels with -100 where no loss).

    round(mask_prob * m) of the m non-special tokens are chosen (at least one); of those 80%
    become ``mask_id``, 10% a random token and 10% stay.
    """
    ids = np.asarray(ids, dtype=np.int64)
    cand = np.flatnonzero(np.asarray(special) == SPECIAL_NONE)
    labels = np.full(len(ids), -100, dtype=np.int64)
    if len(cand) == 0:
        return ids.copy(), labels
    k = max(1, int(round(mask_prob * len(cand))))
    chosen = np.sort(rng.choice(cand, size=min(k, len(cand)), replace=False))
    labels[chosen] = ids[chosen]
    out = ids.copy()
    u = rng.random(len(chosen))
    out[chosen[u < 0.8]] = mask_id
    rand = chosen[(u >= 0.8) & (u < 0.9)]
    out[rand] = rng.integers(0, vocab_size, size=len(rand))
    return out, labels


def causal_lm_labels(ids: np.ndarray) -> np.ndarray:
    """Labels of the causal LM loss before the shift: every real token (the model shifts)."""
    return np.asarray(ids, dtype=np.int64).copy()


def group_sums(grad: np.ndarray, types: np.ndarray, n_groups: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sum of |grad| and cell counts per key type for one sequence's [H, n, n] gradients.

    Under a causal mask only the cells j <= i count.
    """
    h, n, _ = grad.shape
    g = np.abs(grad)
    if causal:
        allowed = np.tril(np.ones((n, n), dtype=bool))
        per_key = np.where(allowed, g, 0.0).sum((0, 1))
        cells = h * allowed.sum(0)
    else:
        per_key = g.sum((0, 1))
        cells = np.full(n, h * n)
    return np.bincount(types, weights=per_key, minlength=n_groups), np.bincount(
        types, weights=cells, minlength=n_groups
    )


def gradient_importance(
    model,
    tokenizer,
    tokenized: Sequence[TokenizedRecord],
    kind: str,
    mask_prob: float = 0.15,
    seed: int = 0,
    batch_size: int = 4,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Sum of |dL/dA| and cell counts per (layer, key type) over ``tokenized``; and the mean loss.

    Returns (sums [L, K], counts [L, K], mean per-sequence loss).
    """
    import torch
    import torch.nn.functional as F

    causal = kind == "decoder"
    n_layers = int(model.config.num_hidden_layers)
    device = input_device(model)
    for p in model.parameters():
        p.requires_grad_(False)
    pad_id = pad_token(tokenizer)
    if not causal and tokenizer.mask_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no mask token; masked-LM loss impossible")
    embed = word_embeddings(model)
    vocab = int(model.config.vocab_size)
    sums = np.zeros((n_layers, len(KEY_TYPES)))
    counts = np.zeros((n_layers, len(KEY_TYPES)))
    losses = []
    lengths = np.array([len(t) for t in tokenized])
    batches = length_batches(lengths, batch_size)
    for pos in progress(batches, "gradients", int(lengths.sum()), "tokens", weight=lambda p: lengths[p].sum()):
        batch = [tokenized[p] for p in pos]
        inputs = model_inputs(batch, model, pad_id)
        n_max = inputs["input_ids"].shape[1]
        labels = np.full((len(batch), n_max), -100, dtype=np.int64)
        ids = inputs["input_ids"].cpu().numpy().copy()
        for b, t in enumerate(batch):
            if causal:
                labels[b, : len(t)] = causal_lm_labels(t.ids)
            else:
                rng = np.random.default_rng([seed, t.record_index])
                ids[b, : len(t)], labels[b, : len(t)] = mlm_inputs(
                    t.ids, t.special, rng, mask_prob, tokenizer.mask_token_id, vocab
                )
        emb = embed(torch.from_numpy(ids).to(device)).detach().requires_grad_(True)
        inputs.pop("input_ids")
        with torch.enable_grad():
            out = model(inputs_embeds=emb, **inputs, output_attentions=True)
            if not out.attentions or len(out.attentions) != n_layers:
                raise RuntimeError(
                    "the model returned no attention probabilities; load it with attn_implementation='eager'"
                )
            for a in out.attentions:
                a.retain_grad()
            logits = out.logits.float()
            target = torch.from_numpy(labels).to(device)
            if causal:
                logits, target = logits[:, :-1], target[:, 1:]
            tok_loss = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
            n_targets = (target != -100).sum(1).clamp(min=1)
            seq_loss = tok_loss.sum(1) / n_targets
            seq_loss.sum().backward()
        losses += seq_loss.detach().cpu().tolist()
        for layer, a in enumerate(out.attentions):
            grad = a.grad.float().cpu().numpy()
            for b, t in enumerate(batch):
                n = len(t)
                s, c = group_sums(grad[b, :, :n, :n], key_types(t.special, t.pieces, causal), len(KEY_TYPES), causal)
                sums[layer] += s
                counts[layer] += c
    return sums, counts, float(np.mean(losses)) if losses else float("nan")


def importance_table(
    model_name: str, kind: str, sums: np.ndarray, counts: np.ndarray, n_sequences: int, mean_loss: float
) -> pd.DataFrame:
    """Tidy table: one row per (layer, key type) present, with the mean |dL/dA|."""
    layer, group = np.nonzero(counts > 0)
    return pd.DataFrame(
        {
            "model": model_name,
            "model_kind": kind,
            "status": "ok",
            "reason": "",
            "loss_kind": "causal_lm" if kind == "decoder" else "masked_lm",
            "layer": layer,
            "key_type": np.array(KEY_TYPES)[group],
            "mean_abs_grad": sums[layer, group] / counts[layer, group],
            "n_cells": counts[layer, group].astype(np.int64),
            "n_sequences": n_sequences,
            "mean_loss": mean_loss,
        },
        columns=COLUMNS,
    )


def skipped_table(model_name: str, kind: str, reason: str) -> pd.DataFrame:
    """The one-row table of a model without an LM head."""
    return pd.DataFrame(
        [{"model": model_name, "model_kind": kind, "status": "skipped", "reason": reason}], columns=COLUMNS
    )


def gradient_table(
    spec,
    records,
    cache_dir=None,
    overflow: str = "skip",
    n_segments: int = 100,
    mask_prob: float = 0.15,
    seed: int = 0,
    batch_size: int = 4,
    device: str | None = None,
) -> pd.DataFrame:
    """Fig. 3 table of one model (a :class:`~headatlas.core.models.ModelSpec`) on the first
    ``n_segments`` records, tokenised exactly as extraction does; a skipped table when the
    model has no LM head."""
    from transformers import AutoConfig, AutoTokenizer

    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    kind = model_kind(config, spec)
    model, reason = lm_head_model(loc, kind, kwargs, spec, device or job_device(spec.device))  # or split
    if model is None:
        log.warning("model %s: gradient importance skipped: %s", spec.name, reason)
        return skipped_table(spec.name, kind, reason)
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    if kind == "encoder" and tokenizer.mask_token_id is None:
        reason = f"tokenizer {type(tokenizer).__name__} has no mask token, so there is no masked-LM loss"
        log.warning("model %s: gradient importance skipped: %s", spec.name, reason)
        return skipped_table(spec.name, kind, reason)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, counts = tokenize_records(records[:n_segments], tokenizer, kind, spec.max_length, overflow, bos)
    if not tokenized:
        raise ValueError(
            f"model {spec.name!r}: none of the first {n_segments} records fits in {spec.max_length} tokens"
        )
    log.info(
        "model %s (%s): %d sequences (%s), loss %s",
        spec.name,
        kind,
        len(tokenized),
        counts.values,
        "causal LM" if kind == "decoder" else "masked LM",
    )
    sums, cells, loss = gradient_importance(model, tokenizer, tokenized, kind, mask_prob, seed, batch_size)
    log.info("model %s: mean loss %.3f", spec.name, loss)
    return importance_table(spec.name, kind, sums, cells, len(tokenized), loss)
