"""One multiple-testing adjustment for every per-head test family (Pande's roles, the detectors)."""

from __future__ import annotations

import numpy as np


def adjust(p: np.ndarray, alpha: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Multiple-testing adjustment (any ``statsmodels`` ``multipletests`` method, e.g. ``fdr_bh``)
    over the finite p-values (the family); NaN stays NaN and is never rejected.
    Returns (adjusted p-values, rejected)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, dtype=np.float64)
    adj = np.full(p.shape, np.nan)
    reject = np.zeros(p.shape, dtype=bool)
    fin = np.isfinite(p)
    if fin.any():
        r, a, _, _ = multipletests(p[fin], alpha=alpha, method=method)
        adj[fin], reject[fin] = a, r
    return adj, reject
