"""One percentile bootstrap for every confidence interval of a mean (Clark's accuracies, Pande's effects).

Two resampling units, said explicitly by ``clusters``:

- per item (``clusters=None``): the rows of ``values`` are drawn with replacement; the
  statistic is each column's mean (Pande: sentence scores, one row per sentence);
- clustered (``clusters`` = one label per row): whole clusters are drawn with replacement and
  the statistic is the pooled mean over the drawn clusters' rows, sum / count (Clark: word
  or anaphor correctness, clustered by sentence or document).

A per-item bootstrap is the clustered one with one row per cluster (the same draws give the
same interval when the cluster labels are 0..n-1 in order).
"""

from __future__ import annotations

import numpy as np


def resample_counts(rng: np.random.Generator, n: int, b: int) -> np.ndarray:
    """[b, n] bootstrap counts: how often each of n units is drawn in each of b resamples."""
    idx = rng.integers(0, n, size=(b, n), dtype=np.int64)
    idx += n * np.arange(b, dtype=np.int64)[:, None]
    return np.bincount(idx.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def bootstrap_ci(
    values: np.ndarray,
    *,
    n_boot: int,
    level: float = 0.95,
    rng: np.random.Generator | None = None,
    clusters: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI (lo, hi), one per column, of the mean of ``values`` [n] or [n, C].

    ``clusters``: None for the per-item bootstrap, else a label per row (whole clusters are
    resampled; clusters are ordered by label). ``counts``: precomputed :func:`resample_counts`
    over the units (items or clusters), else they are drawn from ``rng``. With no resample or
    no row, the interval is NaN.
    """
    x = np.asarray(values, dtype=np.float64)
    x2 = x[:, None] if x.ndim == 1 else x
    if len(x2) == 0 or (counts is None and n_boot <= 0):
        nan = np.full(x2.shape[1], np.nan)
        return nan, nan.copy()
    if clusters is None:
        sums, sizes = x2, np.ones(len(x2))
    else:
        _, inv = np.unique(np.asarray(clusters), return_inverse=True)
        sums = np.stack([np.bincount(inv, weights=col) for col in x2.T], axis=1)
        sizes = np.bincount(inv).astype(np.float64)
    if counts is None:
        if rng is None:
            raise ValueError("bootstrap_ci: give rng or counts")
        counts = resample_counts(rng, len(sizes), n_boot)
    means = (counts @ sums) / (counts @ sizes)[:, None]  # [b, C]
    q = (1 - level) / 2
    lo, hi = np.quantile(means, [q, 1 - q], axis=0)
    return lo, hi
