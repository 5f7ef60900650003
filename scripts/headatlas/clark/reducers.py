"""Clark et al.'s per-head statistics as reducers (:mod:`headatlas.core.reduce`): the same numbers as
:func:`headatlas.clark.surface.surface_table` and :func:`headatlas.clark.clustering.js_distance_matrix`,
computed on a padded ``[B, H, n, n]`` batch with masks, on the device where the attention is.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP
from ..core.reduce import Reducer, ReduceBatch
from .surface import STATS, punct_mask

COL = {s: i for i, s in enumerate(STATS)}


def batch_surface_stats(attn, batch: ReduceBatch, causal: bool, smoothing: float):
    """[B, H, len(STATS)] float64 statistics of each sequence of a padded batch, NaN where undefined:
    :func:`headatlas.clark.surface.sequence_stats` for every sequence at once."""
    import torch

    dev = attn.device
    m = batch.masks(dev, causal)
    valid, cell = m["valid"], m["cell"]
    a = torch.where(cell[:, None], attn.double(), 0.0)  # padded rows and columns never count
    bsz, h, n, _ = a.shape
    nf = batch.tensor("lengths", dev).double()  # [B]
    special = batch.tensor("special", dev)
    out = torch.full((bsz, h, len(STATS)), math.nan, dtype=torch.float64, device=dev)
    per_n = nf[:, None]
    if not causal:
        out[..., COL["next"]] = a.diagonal(1, -2, -1).sum(-1) / per_n
    out[..., COL["prev"]] = a.diagonal(-1, -2, -1).sum(-1) / per_n
    out[..., COL["self"]] = a.diagonal(0, -2, -1).sum(-1) / per_n
    col_mass = a.sum(2) / nf[:, None, None]  # [B, H, n]

    def share(mask):  # (1/n) sum_i sum_{j in mask} A_ij; NaN where the sequence has no such key
        s = (col_mass * mask[:, None, :]).sum(-1)
        return torch.where(mask.any(1)[:, None], s, math.nan)

    out[..., COL["cls"]] = share(special == (SPECIAL_BOS if causal else SPECIAL_CLS))
    sep = special == SPECIAL_SEP
    has_sep = sep.any(1)[:, None]
    out[..., COL["sep"]] = share(sep)
    to_sep = (a * sep[:, None, None, :]).sum(-1)  # [B, H, n]
    other = valid & ~sep
    s2s = (to_sep * sep[:, None, :]).sum(-1) / sep.sum(1).clamp(min=1)[:, None]
    o2s = (to_sep * other[:, None, :]).sum(-1) / other.sum(1).clamp(min=1)[:, None]
    out[..., COL["sep_to_sep"]] = torch.where(has_sep, s2s, math.nan)
    out[..., COL["other_to_sep"]] = torch.where(has_sep & other.any(1)[:, None], o2s, math.nan)
    punct = torch.as_tensor(np.stack([punct_mask(p, s) for p, s in zip(batch.piece, batch.special)]), device=dev)
    out[..., COL["punct"]] = (col_mass * punct[:, None, :]).sum(-1)
    # entropy of the smoothed rows (1-eps) A + eps/k_i over each row's allowed keys
    idx = torch.arange(n, device=dev, dtype=torch.float64)
    allowed = m["allowed"][:, None]
    k = (idx + 1)[None, :].expand(bsz, n) if causal else nf[:, None].expand(bsz, n)  # [B, n]
    smooth = (1 - smoothing) * a + smoothing * allowed / k[:, None, :, None]
    pos = allowed & (smooth > 0)
    ent = -torch.where(pos, smooth * torch.log(torch.where(pos, smooth, 1.0)), 0.0).sum(-1)  # [B, H, n]
    del smooth, pos
    out[..., COL["entropy"]] = (ent * valid[:, None, :]).sum(-1) / per_n
    if causal:
        uniform = (torch.log(idx + 1)[None, :] * valid).sum(-1) / nf
    else:
        uniform = torch.log(nf)
    out[..., COL["entropy_uniform"]] = uniform[:, None]
    if causal:
        summary = batch.tensor("lengths", dev) - 1
        has = torch.ones(bsz, dtype=torch.bool, device=dev)
    else:
        is_cls = special == SPECIAL_CLS
        has = is_cls.any(1)
        summary = torch.where(has, is_cls.int().argmax(1), 0)
    cls_ent = ent.gather(2, summary[:, None, None].expand(bsz, h, 1))[..., 0]
    out[..., COL["cls_entropy"]] = torch.where(has[:, None], cls_ent, math.nan)
    out[..., COL["cls_entropy_uniform"]] = torch.where(has, torch.log(nf), math.nan)[:, None]
    return out


class SurfaceReducer(Reducer):
    """Clark's surface statistics per head: ``result()`` is :func:`headatlas.clark.surface.surface_table`'s
    table (means over the sequences where a statistic is defined)."""

    name = "clark_surface"

    def __init__(self, smoothing: float = 1e-4):
        self.smoothing = smoothing

    def start(self, info) -> None:
        super().start(info)
        self.total = None  # [L, H, S] running sums on the device, float64
        self.count = None

    def update(self, layer: int, attn, batch: ReduceBatch) -> None:
        import torch

        s = batch_surface_stats(attn, batch, self.info.causal, self.smoothing)
        ok = ~torch.isnan(s)
        if self.total is None:
            shape = (self.info.n_layers, self.info.n_heads, len(STATS))
            self.total = torch.zeros(shape, dtype=torch.float64, device=attn.device)
            self.count = torch.zeros(shape, dtype=torch.float64, device=attn.device)
        self.total[layer] += torch.where(ok, s, 0.0).sum(0)
        self.count[layer] += ok.sum(0)

    def result(self) -> pd.DataFrame:
        info = self.info
        if self.total is None:
            raise ValueError(f"{self.name}: no sequence was reduced")
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.total.cpu().numpy() / self.count.cpu().numpy()
        rows = [
            {"model": info.model, "model_kind": info.model_kind, "layer": layer, "head": head, "n_sequences": info.n_sequences, **dict(zip(STATS, mean[layer, head]))}
            for layer in range(info.n_layers)
            for head in range(info.n_heads)
        ]
        return pd.DataFrame(rows)


class JSReducer(Reducer):
    """Clark's summed JS distance between every pair of heads (all layers at once), over the first
    ``n_sequences`` sequences in feed order: :func:`headatlas.clark.clustering.js_distance_matrix`'s
    (D [L*H, L*H], sequences used, query tokens). The sequences are taken one by one (each has its own
    n), on the host with the reference's :func:`~headatlas.clark.clustering.js_sums`: only the first
    ``n_sequences`` sequences' maps leave the device."""

    name = "clark_js"
    needs_all_layers = True

    def __init__(self, n_sequences: int = 200, smoothing: float = 1e-3, max_elements: int = 1_000_000):
        self.n_sequences, self.smoothing, self.max_elements = n_sequences, smoothing, max_elements

    def start(self, info) -> None:
        super().start(info)
        self.k_stop = min(self.n_sequences, info.n_sequences) if self.n_sequences else info.n_sequences
        h = info.n_layers * info.n_heads
        self.total = np.zeros((h, h))
        self.tokens = 0

    def update_all(self, attn: list, batch: ReduceBatch) -> None:
        import torch

        from .clustering import js_sums, smoothed_cells

        wanted = np.flatnonzero(batch.seq < self.k_stop)
        if not len(wanted):
            return
        stacked = torch.cat([a[wanted] for a in attn], dim=1)  # [b, L*H, n, n], layer-major heads
        for i, b in enumerate(wanted):  # per sequence: each has its own length and its own JS sum
            n = int(batch.lengths[b])
            maps = stacked[i, :, :n, :n].float().cpu().numpy()
            self.total += js_sums(smoothed_cells(maps, self.info.causal, self.smoothing).astype(np.float32), self.max_elements)
            self.tokens += n

    def result(self):
        return self.total, self.k_stop, self.tokens
