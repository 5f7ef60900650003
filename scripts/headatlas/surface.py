"""Surface statistics per head (Clark et al. 2019, Sec. 3; formulas in shared methods §3.3).

For each sequence (n tokens) and head, with A the n x n map:
- next / prev / self: (1/n) sum_i A[i, i+1] / A[i, i-1] / A[i, i]
- cls, sep, punct: (1/n) sum_i sum_{j in T} A[i, j]; decoders use BOS for the [CLS] part
- sep_to_sep: mean over [SEP] rows of their mass on [SEP]s; other_to_sep: the same over other rows
- entropy: mean over rows of -sum_j A'_ij ln A'_ij (nats), A' = (1-eps) A + eps/k_i, where k_i is the
  number of keys row i may attend to (n, or i+1 under a causal mask); uniform: mean_i ln k_i
Each statistic is averaged over sequences (ignoring sequences where it is undefined).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP

PUNCT = {".", ","}
STATS = ["next", "prev", "self", "cls", "sep", "punct", "sep_to_sep", "other_to_sep", "entropy", "entropy_uniform", "cls_entropy"]


def normalise_piece(piece: str) -> str:
    return piece.replace("##", "").lstrip("Ġ▁ ")


def sequence_stats(maps: np.ndarray, special: np.ndarray, piece: np.ndarray, causal: bool, smoothing: float) -> np.ndarray:
    """[heads, len(STATS)] statistics of one sequence's [H, n, n] maps."""
    h, n, _ = maps.shape
    out = np.full((h, len(STATS)), np.nan)
    idx = np.arange(n)
    out[:, 0] = maps[:, idx[:-1], idx[1:]].sum(-1) / n
    out[:, 1] = maps[:, idx[1:], idx[:-1]].sum(-1) / n
    out[:, 2] = maps[:, idx, idx].sum(-1) / n
    first = SPECIAL_BOS if causal else SPECIAL_CLS
    col_mass = maps.sum(1) / n  # [H, n]: (1/n) sum_i A[i, j]
    out[:, 3] = col_mass[:, special == first].sum(-1)
    sep = special == SPECIAL_SEP
    out[:, 4] = col_mass[:, sep].sum(-1)
    punct = np.array([normalise_piece(p) in PUNCT for p in piece], dtype=bool) & (special == 0)
    out[:, 5] = col_mass[:, punct].sum(-1)
    if sep.any():
        to_sep = maps[:, :, sep].sum(-1)  # [H, n]
        out[:, 6] = to_sep[:, sep].mean(-1)
        if (~sep).any():
            out[:, 7] = to_sep[:, ~sep].mean(-1)
    k = (idx + 1) if causal else np.full(n, n)
    allowed = (idx[None, :] <= idx[:, None]) if causal else np.ones((n, n), dtype=bool)
    smooth = (1 - smoothing) * maps + smoothing * allowed / k[:, None]
    ent = -np.where(allowed, smooth * np.log(np.where(allowed, smooth, 1.0)), 0.0).sum(-1)  # [H, n]
    out[:, 8] = ent.mean(-1)
    out[:, 9] = np.log(k).mean()
    out[:, 10] = ent[:, 0]
    return out


def surface_table(store, smoothing: float = 1e-4, chunk: int = 256) -> pd.DataFrame:
    """Per-head surface statistics over every sequence of an :class:`AttentionStore`."""
    causal = store.meta.get("model_kind") == "decoder"
    rows = []
    for layer in range(store.n_layers):
        total = np.zeros((store.n_heads, len(STATS)))
        count = np.zeros((store.n_heads, len(STATS)))
        for start in range(0, len(store), chunk):
            stop = min(start + chunk, len(store))
            for k, maps in zip(range(start, stop), store.layer_maps(layer, start, stop)):
                t = store.tokens(k)
                s = sequence_stats(maps.astype(np.float64), t["special"], t["piece"], causal, smoothing)
                ok = ~np.isnan(s)
                total += np.where(ok, s, 0.0)
                count += ok
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        for head in range(store.n_heads):
            rows.append({"model": store.meta["model"], "layer": layer, "head": head, "n_sequences": len(store), **dict(zip(STATS, mean[head]))})
    return pd.DataFrame(rows)
