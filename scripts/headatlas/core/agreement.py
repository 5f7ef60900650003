"""Agreement between two per-head scores: Spearman's rho with a seeded bootstrap CI over heads, and top-k overlap
(read by the atlas's method agreement and the circuits' detector agreement)."""

import numpy as np


def spearman_ci(
    x: np.ndarray, y: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> tuple[float, float, float, float, int]:
    """Spearman rho with a seeded bootstrap CI over heads, its p-value and n."""
    from scipy import stats  # here: the workflow imports this module when it plans (scipy.stats: 0.9 CPU-s)

    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return np.nan, np.nan, np.nan, np.nan, n
    rho, p = stats.spearmanr(x, y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    rx = stats.rankdata(x[idx], axis=1)
    ry = stats.rankdata(y[idx], axis=1)
    rx -= rx.mean(1, keepdims=True)
    ry -= ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (rx * ry).sum(1) / np.sqrt((rx**2).sum(1) * (ry**2).sum(1))
    boot = boot[np.isfinite(boot)]
    a = (1 - level) / 2
    return float(rho), float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a)), float(p), n


def topk_overlap(x: np.ndarray, y: np.ndarray, k: int) -> tuple[int, float, float]:
    """Heads among both methods' top k: (count, Jaccard, overlap expected by chance)."""
    ok = np.isfinite(x) & np.isfinite(y)
    idx = np.flatnonzero(ok)
    if len(idx) < k or k == 0:
        return 0, np.nan, np.nan
    tx = set(idx[np.argsort(-x[idx], kind="stable")[:k]])
    ty = set(idx[np.argsort(-y[idx], kind="stable")[:k]])
    both = len(tx & ty)
    return both, both / len(tx | ty), k * k / len(idx)
