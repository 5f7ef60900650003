"""The detectors as one reducer (:mod:`headatlas.core.reduce`): per sequence, layer and head, the observed score
of each detector and the same score under a shuffled-position null, from a layer view (maps or map-free).

Per query i of a sequence of n tokens (content = tokens that are no special token):

- ``prev``: Clark's previous-token score (:mod:`headatlas.core.patterns`): attention to token i - 1, over n;
- ``duplicate``: attention to the other occurrence of the query's token: the nearest earlier content token with
  the same piece (decoder); for an encoder the nearest other one, earlier or later (ties: the earlier);
- ``induction``: attention to the token right after that occurrence (a content token, not the query itself);
  on the repeated random input this is t_{i+1} after the first occurrence, from the second occurrence
  (decoder), and also from the first occurrence to the token after the second one (encoder);
- ``sink``: attention to the first token (Gu et al.'s alpha_1: every query, [CLS] or BOS included).

A score is the sum over the queries that have a target of A[i, target], divided by n for ``prev`` and
``sink`` (every query counts) and by the number of such queries for ``duplicate`` and ``induction`` (NaN
when a sequence has none). The null score of a sequence takes the same queries and denominator but each
query's target replaced by a key drawn uniformly from the keys that query may attend to (all n for an
encoder, 0..i for a decoder): the maps with positions shuffled within the sequence. The draws are seeded by
(seed, sequence index), so a fused and a replayed feed give the same null.
"""

from __future__ import annotations

import numpy as np

from ..core.data import SPECIAL_NONE
from ..core.layer_view import key_target, offset_target
from ..core.reducer import Needs, ReduceBatch, Reducer
from .registry import REGISTRY, Targets


def other_occurrence(piece: np.ndarray, special: np.ndarray, lengths: np.ndarray, causal: bool) -> np.ndarray:
    """[B, n] position of the other occurrence of each content token's piece (-1: none), see the module doc.
    The content tokens sorted by (sequence, piece, position): the neighbours of a token in that order are its
    nearest earlier and later occurrences (O(n log n), no n x n table: long inputs)."""
    b, n = piece.shape
    out = np.full((b, n), -1, dtype=np.int64)
    idx = np.arange(n)
    content = (special == SPECIAL_NONE) & (idx[None, :] < lengths[:, None])
    if not content.any():
        return out
    rows, pos = np.nonzero(content)
    _, code = np.unique(piece[rows, pos].astype(str), return_inverse=True)
    key = rows.astype(np.int64) * (int(code.max()) + 1) + code.reshape(-1)
    order = np.lexsort((pos, key))
    k, p = key[order], pos[order].astype(np.int64)
    before = np.where(np.r_[False, k[1:] == k[:-1]], np.r_[-1, p[:-1]], -1)  # nearest earlier occurrence
    after = np.where(np.r_[k[:-1] == k[1:], False], np.r_[p[1:], -1], -1)  # nearest later one
    if causal:
        pick = before
    else:  # the nearer one; ties: the earlier
        pick = np.where((before >= 0) & ((after < 0) | (p - before <= after - p)), before, after)
    out[rows[order], p] = pick
    return out


def targets(batch: ReduceBatch, causal: bool, seed: int) -> dict:
    """Per detector of :data:`REGISTRY`, the [B, n] target key of each query (-1: none) and [B] denominators;
    ``null`` [B, n] seeded random keys the query may attend to."""
    lengths, n = batch.lengths, batch.n
    idx = np.arange(n)
    shared = Targets(lengths, batch.special, other_occurrence(batch.piece, batch.special, lengths, causal))
    null = np.zeros((len(batch), n), dtype=np.int64)
    for r, (k, m) in enumerate(zip(batch.seq, lengths)):  # one draw per sequence, not per cell
        u = np.random.default_rng([seed, int(k)]).random(int(m))
        span = idx[:m] + 1 if causal else np.full(m, m)
        null[r, :m] = np.minimum((u * span).astype(np.int64), span - 1)
    t = np.stack([d.target(shared) for d in REGISTRY.values()], 1)  # [B, D, n]
    count = (t >= 0).sum(-1).astype(np.float64)
    every = np.array([d.every_query for d in REGISTRY.values()])
    den = np.where(every[None, :], lengths[:, None].astype(np.float64), count)
    return {"target": t, "den": den, "null": null}


class DetectorReducer(Reducer):
    """Observed and null scores of :data:`~headatlas.detectors.registry.REGISTRY` per sequence: ``result()`` is a dict of float64 arrays
    ``scores`` and ``null`` [N, L, H, D] (NaN where a sequence has no query for a detector)."""

    name = "detectors"
    analysis = "detectors"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def params(self) -> dict:
        return {"seed": self.seed}

    def start(self, info) -> None:
        super().start(info)
        shape = (info.n_sequences, info.n_layers, info.n_heads, len(REGISTRY))
        self.scores = np.full(shape, np.nan)
        self.null = np.full(shape, np.nan)

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        """Every score is one key per query: the targets (shared by name with other reducers), q, k and LSE."""
        t = self._targets(batch)
        shared = {"offset:-1": lambda: offset_target(batch, -1), "key:0": lambda: key_target(batch, 0)}
        need = {
            d.target_name: shared[d.target_name]() if d.target_name in shared else t["target"][:, i]
            for i, d in enumerate(REGISTRY.values())
        }
        return Needs(targets={**need, "detectors:null": t["null"]})

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """Every score as the sum of its targets' attention (:meth:`~headatlas.core.layer_view.LayerView.target`)."""
        import torch

        t = self._targets(batch)
        dev = view.device
        den = torch.as_tensor(t["den"], device=dev)[:, None, :]
        obs = torch.stack([view.target(d.target_name) for d in REGISTRY.values()], 2)  # [B, H, D, n]
        has = torch.as_tensor(t["target"] >= 0, device=dev)[:, None]  # [B, 1, D, n]
        nul = view.target("detectors:null")[:, :, None] * has
        self.scores[batch.seq, layer] = (obs.sum(-1).double() / den).cpu().numpy()
        self.null[batch.seq, layer] = (nul.sum(-1).double() / den).cpu().numpy()

    def _targets(self, batch: ReduceBatch) -> dict:
        key = ("detectors", self.info.causal, self.seed)
        return batch.memo(key, lambda: targets(batch, self.info.causal, self.seed))

    def result(self) -> dict:
        return {"scores": self.scores, "null": self.null}

    def to_arrays(self, result) -> dict:
        return dict(result)

    @classmethod
    def from_arrays(cls, arrays) -> dict:
        return {"scores": np.asarray(arrays["scores"]), "null": np.asarray(arrays["null"])}

    @classmethod
    def combine(cls, parts: list) -> dict:
        return {k: np.concatenate([p[k] for p in parts]) for k in ("scores", "null")}
