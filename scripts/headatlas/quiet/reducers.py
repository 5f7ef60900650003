"""The reducers of the quiet-heads analysis (:mod:`headatlas.core.reduce`), per sequence, layer and head.

:class:`RowMaxReducer` (attention; map-free where the model allows, :func:`~headatlas.core.mapfree.plan_feed`):

- ``prev`` / ``next``: the share of the query rows with a key at offset -1 (+1) whose largest weight is there, and
  only there (a row whose maximum is tied between keys counts for no offset; under a causal mask no row has a key
  at +1, so ``next`` is NaN for a decoder);
- ``max_weight``: the mean over the rows of the row's largest weight, max_j A_ij = exp(max_j s_ij - LSE_i);
- ``entropy``: the mean over the rows of -sum_j A_ij ln A_ij in nats (the entropy pass of the attention kernel).

The row maximum has no identity in the map-free primitives (targets, value columns, entropy), and the kernels that
compute it for their softmax do not hand it out: the reducer reads the rows a block at a time
(:meth:`~headatlas.core.layer_view.LayerView.row_blocks`; map-free, exact rows recomputed from q, k and the LSE:
about one eager attention pass of work, never a layer's maps).

:class:`ActivityReducer` (no map; forward pre-hooks on the attention output projections, and the model's hidden
states):

- ``norm``: the mean over the real tokens of the L2 norm of each head's output sum_j A_ij v_j (the head's slice of
  the output projection's input, :func:`~headatlas.core.extract.head_output_modules`);
- the massive activations (Sun et al. 2024) of the residual stream entering each layer (``hidden_states[l]``:
  the embeddings for layer 1; the last layer's output is left out, transformers hands it after the final norm
  for decoders): cells x with |x| > ``threshold`` and |x| >= ``ratio`` x the median |x| over the real tokens and
  channels of that sequence's hidden state, with the state's top |x| and median.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.extract import HeadOutputHooks
from ..core.reducer import Needs, ReduceBatch, Reducer

ROW_STATS = ("prev", "next", "max_weight", "entropy")
HIT_COLUMNS = ["sequence", "layer", "token", "channel", "piece", "value", "median"]


def row_max_stats(a, lo: int, lengths, causal: bool):
    """[B, H, r, 3] float32 per query row lo..lo+r-1 of the rows ``a`` [B, H, r, keys] (0 outside the cells a
    real query may see, padded rows 0): the row's largest weight, and whether its unique largest weight is at
    offset -1 and at offset +1 (1.0 / 0.0). ``lengths`` [B] tensor of the sequences' lengths."""
    import torch

    bsz, h, r, keys = a.shape
    top = a.amax(-1)  # [B, H, r]
    unique = (a >= top[..., None]).sum(-1) == 1  # a tie between two keys is no offset's maximum
    i = torch.arange(lo, lo + r, device=a.device)
    real = i[None, :] < lengths[:, None]  # [B, r]
    out = [top]
    for off in (-1, 1):
        j = i + off
        has = real & (j >= 0) & (j < keys) & (j[None, :] < lengths[:, None])
        if causal and off > 0:
            has = torch.zeros_like(has)
        w = a.gather(-1, j.clamp(0, keys - 1)[None, None, :, None].expand(bsz, h, r, 1))[..., 0]
        out.append(((w >= top) & unique & has[:, None]).float())
    return torch.stack(out, -1)


def offset_rows(lengths: np.ndarray, causal: bool) -> np.ndarray:
    """[B, 2] float64 rows of each sequence with a key at offset -1 and at +1 (the shares' denominators)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    inner = np.maximum(lengths - 1, 0)
    return np.stack([inner, np.zeros_like(inner) if causal else inner], 1)


class RowMaxReducer(Reducer):
    """Per sequence, layer and head the :data:`ROW_STATS` means (module docstring): ``result()`` is
    ``{"stats": [N, L, H, 4] float64}`` (NaN for a share whose sequence has no row with that offset)."""

    name = "quiet_rows"
    analysis = "quiet"

    def start(self, info) -> None:
        super().start(info)
        self.stats = np.full((info.n_sequences, info.n_layers, info.n_heads, len(ROW_STATS)), np.nan)

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        return Needs(entropy=True)

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """The row maxima from the rows in blocks (:meth:`~headatlas.core.layer_view.LayerView.row_blocks`); the
        entropy from the view."""
        import torch

        lengths = batch.tensor("lengths", view.device)
        bsz, h, _ = view.shape
        rows = torch.zeros((bsz, h, 3), dtype=torch.float64, device=view.device)
        for sl, a in view.row_blocks():
            rows += row_max_stats(a, sl.start, lengths, view.causal).sum(2).double()
        self._add(layer, torch.cat([rows, view.entropy().double().sum(-1, keepdim=True)], -1), batch)

    def _add(self, layer: int, sums, batch: ReduceBatch) -> None:
        """One layer's [B, H, 4] sums over the rows (max weight, at -1, at +1, entropy) as per-sequence means."""
        s = sums.double().cpu().numpy()
        n = batch.lengths.astype(np.float64)[:, None]
        den = offset_rows(batch.lengths, self.info.causal)
        with np.errstate(invalid="ignore", divide="ignore"):
            at = s[..., 1:3] / den[:, None, :]
        self.stats[batch.seq, layer] = np.concatenate([at, s[..., :1] / n[..., None], s[..., 3:] / n[..., None]], -1)

    def result(self) -> dict:
        return {"stats": self.stats}


class ActivityReducer(HeadOutputHooks):
    """Per sequence, layer and head the mean output norm; per sequence and layer the residual stream's top |x|,
    median |x| and whether it holds a massive activation at the first token; and every massive cell
    (module docstring). Served by either feed: the hooks read whatever attention ran."""

    name = "quiet_activity"
    analysis = "quiet"

    def __init__(self, model, threshold: float = 100.0, ratio: float = 1000.0):
        super().__init__(model)
        self.threshold, self.ratio = float(threshold), float(ratio)

    def capture(self, x):
        """Each head's output norm per token, [B, n, H], from the heads' outputs side by side [B, n, H * d]."""
        return x.reshape(*x.shape[:2], self.info.n_heads, -1).float().norm(dim=-1)

    def start(self, info) -> None:
        super().start(info)
        n, L, H = info.n_sequences, info.n_layers, info.n_heads
        self.norm = np.full((n, L, H), np.nan)
        self.top = np.full((n, L), np.nan)
        self.median = np.full((n, L), np.nan)
        self.first = np.zeros((n, L), dtype=bool)
        self.hits: list[pd.DataFrame] = []

    def update_outputs(self, outputs, batch: ReduceBatch) -> None:
        import torch

        captured = self.take()
        n = batch.n
        valid = batch.masks(captured[0].device, False)["valid"]  # [B, n]
        count = valid.sum(1, keepdim=True).double()
        norms = torch.stack([(c[:, :n] * valid[..., None]).sum(1).double() / count for c in captured], 1)
        self.norm[batch.seq] = norms.cpu().numpy()
        self._massive(outputs.hidden_states[: self.info.n_layers], batch)

    def _massive(self, hidden, batch: ReduceBatch) -> None:
        """The massive cells of each layer's input (``hidden``: L tensors [B, n, D])."""
        import torch

        n = batch.n
        valid = batch.masks(hidden[0].device, False)["valid"]
        for layer, h in enumerate(hidden):
            x = h[:, :n].float().abs()  # [B, n, D]
            med = torch.where(valid[..., None], x, torch.nan).flatten(1).nanmedian(1).values  # [B]
            top = (x * valid[..., None]).flatten(1).amax(1)
            hit = (x > self.threshold) & (x >= self.ratio * med[:, None, None]) & valid[..., None]
            self.top[batch.seq, layer] = top.cpu().numpy()
            self.median[batch.seq, layer] = med.cpu().numpy()
            self.first[batch.seq, layer] = hit[:, 0].any(-1).cpu().numpy()
            b, i, c = (t.cpu().numpy() for t in torch.nonzero(hit, as_tuple=True))
            if len(b):
                value = h[:, :n].float()[hit].cpu().numpy()
                self.hits.append(
                    pd.DataFrame(
                        {
                            "sequence": batch.seq[b],
                            "layer": layer,
                            "token": i,
                            "channel": c,
                            "piece": batch.piece[b, i].astype(str),
                            "value": value,
                            "median": med.cpu().numpy()[b],
                        }
                    )  # fmt: skip
                )

    def result(self) -> dict:
        hits = pd.concat(self.hits, ignore_index=True) if self.hits else pd.DataFrame(columns=HIT_COLUMNS)
        return {"norm": self.norm, "top": self.top, "median": self.median, "first": self.first, "hits": hits}
