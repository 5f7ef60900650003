"""Clustering heads by their attention (Clark et al. 2019, Sec. 6 and Fig. 6; code head_distances.py).

Distance between heads a and b: D(a, b) = sum over every query token of the data of
JS(P^a_i, P^b_i), with each row smoothed as P = (1 - eps) A + eps / k_i (eps = 0.001, k_i the
number of keys row i may attend to: n for encoders, i + 1 for decoders, whose rows are compared
over the allowed keys j <= i only), natural log, JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2, M = (P+Q)/2.

Summed over a sequence's query rows this is a sum over its (allowed) cells c of
    (P_c ln P_c + Q_c ln Q_c) / 2 - M_c ln M_c,
which is computed for a block of heads against all heads at once by broadcasting
(about 1 s per 128-token sequence for 270 heads on one CPU core).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.progress import progress


def smoothed_cells(maps: np.ndarray, causal: bool, smoothing: float) -> np.ndarray:
    """[H, C] smoothed attention of one sequence's [H, n, n] maps, flattened over the
    allowed cells (C = n^2, or n(n+1)/2 under a causal mask)."""
    h, n, _ = maps.shape
    if causal:
        rows, cols = np.tril_indices(n)
        return (1 - smoothing) * maps[:, rows, cols] + smoothing / (rows + 1)
    return ((1 - smoothing) * maps + smoothing / n).reshape(h, n * n)


def js_sums(cells, max_elements: int = 1_000_000):
    """[H, H] sum over cells of JS terms between every pair of rows of ``cells`` [H, C].

    With s = P_a + P_b and M = s / 2, sum_c M ln M = (sum_c s ln s - ln 2 sum_c s) / 2, so the only
    per-pair work is one add, one log and one dot product per cell. Blocks of heads keep at
    most ``max_elements`` cells of s in memory; the symmetry D(a, b) = D(b, a) halves the work.
    Accepts numpy or torch arrays; returns float64 numpy. The diagonal is set to exactly 0 and
    rounding noise below 0 is clipped.
    """
    import torch

    p = torch.as_tensor(cells)
    h, c = p.shape
    plogp = torch.xlogy(p, p).sum(-1).double()  # sum_c P ln P per head
    mass = p.sum(-1).double()  # number of rows (each smoothed row sums to 1)
    half_ln2 = 0.5 * math.log(2.0)
    tiny = torch.finfo(p.dtype).tiny
    out = torch.zeros((h, h), dtype=torch.float64)
    start = 0
    while start < h:
        rest = h - start
        block = max(1, min(rest, max_elements // max(1, rest * c)))
        a = slice(start, start + block)
        b = slice(start, h)
        s = (p[a, None, :] + p[None, b, :]).clamp_(min=tiny)  # 0 ln 0 = 0 without smoothing
        slns = torch.linalg.vecdot(s, torch.log(s)).double()
        mlnm = 0.5 * slns - half_ln2 * (mass[a, None] + mass[None, b])
        d = 0.5 * (plogp[a, None] + plogp[None, b]) - mlnm
        out[a, b] = d
        out[b, a] = d.T
        start += block
    out.fill_diagonal_(0.0)
    return out.clamp_(min=0.0).numpy()


def head_index(n_layers: int, n_heads: int) -> pd.DataFrame:
    """layer, head of every row of a layer-major distance matrix."""
    return pd.DataFrame(
        {"layer": np.repeat(np.arange(n_layers), n_heads), "head": np.tile(np.arange(n_heads), n_layers)}
    )


def distance_long(d: np.ndarray, n_layers: int, n_heads: int, model: str, n_tokens: int) -> pd.DataFrame:
    """Tidy pairs (a <= b) of a distance matrix: summed JS and JS per query token."""
    a, b = np.triu_indices(len(d))
    layer, head = np.divmod(np.arange(len(d)), n_heads)
    return pd.DataFrame(
        {
            "model": model,
            "layer_a": layer[a],
            "head_a": head[a],
            "layer_b": layer[b],
            "head_b": head[b],
            "js_sum": d[a, b],
            "js_per_token": d[a, b] / max(n_tokens, 1),
        }
    )


def distance_square(long: pd.DataFrame) -> tuple[np.ndarray, int, int]:
    """The symmetric matrix (layer-major) back from :func:`distance_long`; uses js_per_token."""
    n_layers = int(max(long["layer_a"].max(), long["layer_b"].max())) + 1
    n_heads = int(max(long["head_a"].max(), long["head_b"].max())) + 1
    a = long["layer_a"].to_numpy() * n_heads + long["head_a"].to_numpy()
    b = long["layer_b"].to_numpy() * n_heads + long["head_b"].to_numpy()
    d = np.full((n_layers * n_heads,) * 2, np.nan)
    d[a, b] = long["js_per_token"].to_numpy()
    d[b, a] = long["js_per_token"].to_numpy()
    if np.isnan(d).any():
        raise ValueError("distance table is missing pairs of heads")
    return d, n_layers, n_heads


def within_between(d: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Mean distance over pairs of distinct heads in the same group and in different groups."""
    groups = np.asarray(groups)
    same = groups[:, None] == groups[None, :]
    off = ~np.eye(len(d), dtype=bool)
    return float(d[same & off].mean()), float(d[~same].mean())


def layer_clustering(d: np.ndarray, layers: np.ndarray, permutations: int = 1000, seed: int = 0) -> dict:
    """Clark's claim that heads of a layer cluster: mean within- vs between-layer distance,
    with a permutation p-value (layer labels shuffled over heads, seeded) for
    between - within being as large as observed."""
    layers = np.asarray(layers)
    within, between = within_between(d, layers)
    observed = between - within
    rng = np.random.default_rng(seed)
    _, codes = np.unique(layers, return_inverse=True)
    n = len(d)
    off = d.copy()
    np.fill_diagonal(off, 0.0)
    total = off.sum()
    sizes = np.bincount(codes)
    n_within = float((sizes * (sizes - 1)).sum())
    n_between = float(n * n - n - n_within)
    hits = 0
    for _ in progress(range(permutations), "layer-clustering permutations", unit="permutations"):
        p = rng.permutation(codes)
        w = off[p[:, None] == p[None, :]].sum()
        stat = (total - w) / n_between - w / n_within
        hits += stat >= observed - 1e-12
    return {
        "within_layer": within,
        "between_layer": between,
        "ratio": between / within if within > 0 else float("inf"),
        "difference": observed,
        "permutations": permutations,
        "p_value": (hits + 1) / (permutations + 1) if permutations else float("nan"),
    }


def mds_embedding(
    d: np.ndarray, seed: int = 0, n_init: int = 5, max_iter: int = 1000, eps: float = 1e-10
) -> tuple[np.ndarray, float]:
    """2-D metric MDS of a precomputed distance matrix (Clark: n_init=5, max_iter=1000, eps=1e-10).

    Returns (coordinates [N, 2], stress). Works across the scikit-learn versions that renamed
    ``dissimilarity`` to ``metric`` (1.8).
    """
    import inspect

    from sklearn.manifold import MDS

    params = inspect.signature(MDS).parameters
    kwargs = dict(n_components=2, n_init=n_init, max_iter=max_iter, eps=eps, random_state=seed)
    if "metric_mds" in params:
        kwargs.update(metric="precomputed", metric_mds=True)
    else:
        kwargs.update(dissimilarity="precomputed", metric=True)
    if "init" in params:
        kwargs["init"] = "random"
    mds = MDS(**kwargs)
    coords = mds.fit_transform(np.asarray(d, dtype=np.float64))
    return coords, float(mds.stress_)


def mds_tables(
    long: pd.DataFrame,
    behaviour: pd.DataFrame,
    model: str,
    *,
    seed: int = 0,
    n_init: int = 5,
    max_iter: int = 1000,
    eps: float = 1e-10,
    permutations: int = 1000,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Rule clark_mds: per head its MDS coordinates and behaviour label (``heads``), the
    within- vs between-layer distance test with the MDS stress (``layers``), and the test's
    statistics, from the long JS distance table and the behaviour table."""
    d, n_layers, n_heads = distance_square(long)
    coords, stress = mds_embedding(d, seed, n_init, max_iter, eps)
    heads = head_index(n_layers, n_heads)
    heads = heads.merge(
        behaviour[["model", "layer", "head", "label"]], on=["layer", "head"], how="left", validate="1:1"
    )
    heads = heads[["model", "layer", "head", "label"]].assign(mds_x=coords[:, 0], mds_y=coords[:, 1])
    stats = layer_clustering(d, heads["layer"].to_numpy(), permutations, seed)
    layers = pd.DataFrame(
        [
            dict(
                model=model,
                **stats,
                mds_stress=stress,
                n_sequences=int(long["n_sequences"].iloc[0]),
                n_tokens=int(long["n_tokens"].iloc[0]),
            )
        ]
    )
    return heads, layers, stats
