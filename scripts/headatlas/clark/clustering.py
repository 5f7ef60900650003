"""Clustering heads by their attention (Clark et al. 2019, Sec. 6 and Fig. 6; code head_distances.py).

Distance between heads a and b: D(a, b) = sum over every query token of the data of
JS(P^a_i, P^b_i), with each row smoothed as P = (1 - eps) A + eps / k_i (eps = 0.001, k_i the
number of keys row i may attend to: n for encoders, i + 1 for decoders, whose rows are compared
over the allowed keys j <= i only), natural log, JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2, M = (P+Q)/2.

Summed over a sequence's query rows this is a sum over its (allowed) cells c of
    (P_c ln P_c + Q_c ln Q_c) / 2 - M_c ln M_c,
which is computed for a block of heads against all heads at once by broadcasting
(about 1 s per 128-token sequence for 270 heads on one CPU core).

The cost grows with the square of the head count; above ``clustering.max_heads`` the distances, the MDS and
the layer test are those of a seeded sample of heads, the same number from every layer (:func:`sample_heads`).
Such a stratified sample gives every within-layer pair the same chance to be drawn, and every between-layer
pair too, so the sample's mean within- and between-layer distances are unbiased for the means over every head
(checked exactly in tests/unit/clark/test_clustering.py by enumerating the samples; their spread is in docs/plan.md).
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


def sample_heads(n_layers: int, n_heads: int, max_heads: int | None, seed: int = 0) -> np.ndarray:
    """Layer-major indices of the heads whose JS distances are computed: every head when ``max_heads`` is None or
    at least L x H; else ``k = min(H, max(2, max_heads // L))`` heads of every layer (two at least, so that
    within-layer pairs exist), drawn without replacement with ``seed``, sorted."""
    n = n_layers * n_heads
    if max_heads is None or max_heads >= n:
        return np.arange(n)
    k = min(n_heads, max(2, max_heads // n_layers))
    rng = np.random.default_rng([seed, n_layers, n_heads, k])
    pick = rng.permuted(np.tile(np.arange(n_heads), (n_layers, 1)), axis=1)[:, :k]
    return np.sort((np.arange(n_layers)[:, None] * n_heads + pick).ravel())


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


def distance_long(
    d: np.ndarray, n_layers: int, n_heads: int, model: str, n_tokens: int, heads: np.ndarray | None = None
) -> pd.DataFrame:
    """Tidy pairs (a <= b) of a distance matrix: summed JS and JS per query token. ``heads``: the layer-major
    index of each row of ``d`` (None: every head in order)."""
    a, b = np.triu_indices(len(d))
    layer, head = np.divmod(np.arange(len(d)) if heads is None else np.asarray(heads), n_heads)
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


def distance_square(long: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """The symmetric matrix back from :func:`distance_long` (uses js_per_token) over the heads of the table, and
    their ``layer``, ``head`` (layer-major order: every head, or the sample of ``clustering.max_heads``)."""
    n_heads = int(max(long["head_a"].max(), long["head_b"].max())) + 1
    ka = long["layer_a"].to_numpy() * n_heads + long["head_a"].to_numpy()
    kb = long["layer_b"].to_numpy() * n_heads + long["head_b"].to_numpy()
    keys = np.unique(np.concatenate([ka, kb]))
    a, b = np.searchsorted(keys, ka), np.searchsorted(keys, kb)
    d = np.full((len(keys),) * 2, np.nan)
    d[a, b] = long["js_per_token"].to_numpy()
    d[b, a] = long["js_per_token"].to_numpy()
    if np.isnan(d).any():
        raise ValueError("distance table is missing pairs of heads")
    return d, pd.DataFrame({"layer": keys // n_heads, "head": keys % n_heads})


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
    statistics, from the long JS distance table and the behaviour table. Over the heads of the distance table:
    when they are a sample (``clustering.max_heads``), ``heads`` has their rows only and ``layers`` says how many
    of how many heads (``heads_sampled``, ``heads_total``)."""
    d, heads = distance_square(long)
    coords, stress = mds_embedding(d, seed, n_init, max_iter, eps)
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
    total = int(behaviour[["layer", "head"]].drop_duplicates().shape[0])
    if len(heads) < total:
        layers["heads_sampled"], layers["heads_total"] = len(heads), total
    return heads, layers, stats
