"""Clark's surface statistics on stored maps, one sequence at a time (the reference of
:class:`headatlas.clark.reducers.SurfaceReducer`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from headatlas.clark.surface import STATS, punct_mask
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP
from headatlas.core.progress import progress


def prev_token_score(maps: np.ndarray, n) -> np.ndarray:
    """Clark's previous-token score of maps [..., n, n]: ``(1/n) sum_{i >= 1} maps[..., i, i-1]``."""
    rows = np.arange(1, maps.shape[-1])
    return maps[..., rows, rows - 1].sum(-1) / n


def causal_allowed(n: int) -> np.ndarray:
    """[n, n] True where key j <= query i."""
    idx = np.arange(n)
    return idx[None, :] <= idx[:, None]


def row_entropy(maps: np.ndarray, causal: bool, smoothing: float) -> np.ndarray:
    """[H, n] entropies (nats) of the smoothed rows (1-eps) A + eps/k_i over each row's allowed keys."""
    n = maps.shape[-1]
    if causal:
        allowed = causal_allowed(n)
        k = np.arange(1, n + 1)
    else:
        allowed = np.ones((n, n), dtype=bool)
        k = np.full(n, n)
    smooth = (1 - smoothing) * maps + smoothing * allowed / k[:, None]
    pos = allowed & (smooth > 0)  # 0 ln 0 = 0 (smoothing 0 is allowed by the schema)
    return -np.where(pos, smooth * np.log(np.where(pos, smooth, 1.0)), 0.0).sum(-1)


def sequence_stats(
    maps: np.ndarray, special: np.ndarray, piece: np.ndarray, causal: bool, smoothing: float
) -> np.ndarray:
    """[heads, len(STATS)] statistics of one sequence's [H, n, n] maps."""
    h, n, _ = maps.shape
    special = np.asarray(special)
    out = np.full((h, len(STATS)), np.nan)
    col = {s: i for i, s in enumerate(STATS)}
    idx = np.arange(n)
    if not causal:
        out[:, col["next"]] = maps[:, idx[:-1], idx[1:]].sum(-1) / n
    out[:, col["prev"]] = prev_token_score(maps, n)
    out[:, col["self"]] = maps[:, idx, idx].sum(-1) / n
    col_mass = maps.sum(1) / n  # [H, n]: (1/n) sum_i A[i, j]
    first = special == (SPECIAL_BOS if causal else SPECIAL_CLS)
    if first.any():
        out[:, col["cls"]] = col_mass[:, first].sum(-1)
    sep = special == SPECIAL_SEP
    if sep.any():
        out[:, col["sep"]] = col_mass[:, sep].sum(-1)
        to_sep = maps[:, :, sep].sum(-1)  # [H, n]
        out[:, col["sep_to_sep"]] = to_sep[:, sep].mean(-1)
        if (~sep).any():
            out[:, col["other_to_sep"]] = to_sep[:, ~sep].mean(-1)
    out[:, col["punct"]] = col_mass[:, punct_mask(piece, special)].sum(-1)
    ent = row_entropy(maps, causal, smoothing)
    out[:, col["entropy"]] = ent.mean(-1)
    out[:, col["entropy_uniform"]] = np.log(idx + 1).mean() if causal else np.log(n)
    summary = (
        n - 1 if causal else (int(np.flatnonzero(special == SPECIAL_CLS)[0]) if (special == SPECIAL_CLS).any() else -1)
    )
    if summary >= 0:
        out[:, col["cls_entropy"]] = ent[:, summary]
        out[:, col["cls_entropy_uniform"]] = np.log(n)
    return out


def surface_table(store, smoothing: float = 1e-4, max_bytes: int = 256 << 20) -> pd.DataFrame:
    """Per-head surface statistics over every sequence of an :class:`AttentionStore`, read in
    runs of at most ``max_bytes`` of one layer's maps (:meth:`AttentionStore.chunks`).

    Columns: model, model_kind, layer, head, n_sequences, then :data:`STATS`.
    """
    kind = store.meta.get("model_kind", "encoder")
    causal = kind == "decoder"
    rows = []
    for layer in progress(range(store.n_layers), f"surface statistics {store.meta.get('model', '')}", unit="layers"):
        total = np.zeros((store.n_heads, len(STATS)))
        count = np.zeros((store.n_heads, len(STATS)))
        for start, stop in store.chunks(max_bytes):
            for k, maps in zip(range(start, stop), store.layer_maps(layer, start, stop)):
                t = store.tokens(k)
                s = sequence_stats(maps.astype(np.float64), t["special"], t["piece"], causal, smoothing)
                ok = ~np.isnan(s)
                total += np.where(ok, s, 0.0)
                count += ok
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        for head in range(store.n_heads):
            rows.append(
                {
                    "model": store.meta["model"],
                    "model_kind": kind,
                    "layer": layer,
                    "head": head,
                    "n_sequences": len(store),
                    **dict(zip(STATS, mean[head])),
                }
            )
    return pd.DataFrame(rows)
