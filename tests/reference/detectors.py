"""The detectors' duplicate targets from a full n x n table (the reducer's ``other_occurrence`` before it sorted)."""

import numpy as np

from headatlas.core.data import SPECIAL_NONE


def other_occurrence(piece: np.ndarray, special: np.ndarray, lengths: np.ndarray, causal: bool) -> np.ndarray:
    """[B, n] the nearest other content token with the same piece (decoder: earlier only; ties: the earlier), -1: none."""
    b, n = piece.shape
    _, code = np.unique(piece.astype(str), return_inverse=True)
    code = code.reshape(b, n)
    idx = np.arange(n)
    content = (special == SPECIAL_NONE) & (idx[None, :] < lengths[:, None])
    same = (code[:, :, None] == code[:, None, :]) & content[:, :, None] & content[:, None, :]
    same &= idx[:, None] != idx[None, :]
    if causal:
        same &= idx[None, :] < idx[:, None]
    dist = np.abs(idx[:, None] - idx[None, :]) * 2 + (idx[None, :] > idx[:, None])
    dist = np.where(same, dist[None], np.iinfo(np.int64).max)
    return np.where(same.any(-1), dist.argmin(-1), -1)
