"""Jensen-Shannon head distances, layer clustering and MDS on hand-built maps."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon

from headatlas.clark.clustering import (
    distance_long,
    distance_square,
    js_sums,
    layer_clustering,
    mds_embedding,
    mds_tables,
    sample_heads,
    smoothed_cells,
    within_between,
)


def random_maps(h: int, n: int, seed: int = 0, causal: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(h, n, n)) * 3
    if causal:
        logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True)


def reference_js(maps: np.ndarray, causal: bool, eps: float) -> np.ndarray:
    """Row-by-row JS with scipy (jensenshannon returns the square root of the divergence)."""
    h, n, _ = maps.shape
    d = np.zeros((h, h))
    for a in range(h):
        for b in range(h):
            for i in range(n):
                k = i + 1 if causal else n
                p = (1 - eps) * maps[a, i, :k] + eps / k
                q = (1 - eps) * maps[b, i, :k] + eps / k
                d[a, b] += jensenshannon(p, q) ** 2
    return d


@pytest.mark.parametrize("causal", [False, True])
def test_js_matches_scipy_row_by_row(causal):
    maps = random_maps(5, 7, causal=causal)
    cells = smoothed_cells(maps, causal, 1e-3)
    got = js_sums(cells.astype(np.float64), max_elements=2000)  # forces several blocks
    np.testing.assert_allclose(got, reference_js(maps, causal, 1e-3), rtol=1e-6, atol=1e-9)


def test_js_of_a_head_with_itself_is_zero_and_symmetric():
    maps = random_maps(4, 9, seed=1)
    maps = np.concatenate([maps, maps[:1]])  # head 4 is a copy of head 0
    d = js_sums(smoothed_cells(maps, False, 1e-3).astype(np.float32))
    assert np.all(np.diag(d) == 0.0)
    assert d[0, 4] == pytest.approx(0.0, abs=1e-5)
    np.testing.assert_array_equal(d, d.T)
    assert (d[np.triu_indices(4, 1)] > 0.01).all()


def test_js_of_disjoint_one_hot_heads_is_ln2_per_row():
    n = 6
    nxt = np.zeros((n, n))
    nxt[np.arange(n), (np.arange(n) + 1) % n] = 1
    prv = np.zeros((n, n))
    prv[np.arange(n), (np.arange(n) - 1) % n] = 1
    d = js_sums(smoothed_cells(np.stack([nxt, prv]), False, 0.0))
    assert d[0, 1] == pytest.approx(n * np.log(2))


def test_causal_cells_are_the_lower_triangle():
    maps = random_maps(2, 4, causal=True)
    cells = smoothed_cells(maps, True, 0.0)
    assert cells.shape == (2, 10)
    np.testing.assert_allclose(cells.sum(-1), 4.0)  # four rows, each summing to 1


def test_distance_round_trip_through_the_long_table():
    d = js_sums(smoothed_cells(random_maps(6, 5), False, 1e-3))
    long = distance_long(d, 2, 3, "m", n_tokens=10)
    back, index = distance_square(long)
    assert index["layer"].tolist() == [0, 0, 0, 1, 1, 1] and index["head"].tolist() == [0, 1, 2] * 2
    np.testing.assert_allclose(back, d / 10)
    assert len(long) == 6 * 7 // 2
    heads = np.array([1, 2, 3, 5])  # a sample: rows of d are these heads of 2 x 3
    long = distance_long(d[:4, :4], 2, 3, "m", n_tokens=10, heads=heads)
    back, index = distance_square(long)
    assert (index["layer"] * 3 + index["head"]).tolist() == heads.tolist()
    np.testing.assert_allclose(back, d[:4, :4] / 10)


def test_sample_heads_takes_the_same_number_from_every_layer():
    assert sample_heads(3, 4, None).tolist() == list(range(12)) == sample_heads(3, 4, 12).tolist()
    got = sample_heads(3, 8, 12, seed=1)
    assert len(got) == 12 and (np.diff(got) > 0).all() and (np.bincount(got // 8) == 4).all()
    assert got.tolist() == sample_heads(3, 8, 12, seed=1).tolist() != sample_heads(3, 8, 12, seed=2).tolist()
    assert (np.bincount(sample_heads(3, 8, 4) // 8) == 2).all()  # two per layer at least: within-layer pairs exist


def test_the_stratified_samples_layer_means_average_to_every_heads():
    # every sample of 2 of 4 heads per layer (6^3, equally likely): the mean of the sample's within- and
    # between-layer means is exactly the mean over every head (what makes max_heads unbiased)
    rng = np.random.default_rng(5)
    n_layers, n_heads, k = 3, 4, 2
    x = rng.random((12, 12))
    d = x + x.T
    np.fill_diagonal(d, 0)
    layers = np.repeat(np.arange(n_layers), n_heads)
    per_layer = list(itertools.combinations(range(n_heads), k))
    got = []
    for pick in itertools.product(per_layer, repeat=n_layers):
        idx = np.array([layer * n_heads + h for layer, hs in enumerate(pick) for h in hs])
        got.append(within_between(d[np.ix_(idx, idx)], layers[idx]))
    np.testing.assert_allclose(np.mean(got, axis=0), within_between(d, layers), rtol=1e-12)
    drawn = sample_heads(n_layers, n_heads, 6, seed=0)
    assert tuple(tuple(drawn[drawn // n_heads == i] % n_heads) for i in range(n_layers)) in set(
        itertools.product(per_layer, repeat=n_layers)
    )


def test_within_between_and_permutation_test():
    rng = np.random.default_rng(0)
    layers = np.repeat(np.arange(4), 5)
    centres = rng.normal(size=(4, 2)) * 10
    pts = centres[layers] + rng.normal(size=(20, 2)) * 0.1
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    within, between = within_between(d, layers)
    assert within < between
    stats = layer_clustering(d, layers, permutations=200, seed=0)
    assert stats["p_value"] == pytest.approx(1 / 201)
    assert stats["ratio"] > 5
    # no structure: layer labels unrelated to position
    flat = np.linalg.norm(rng.normal(size=(20, 2))[:, None] - rng.normal(size=(20, 2))[None], axis=-1)
    flat = (flat + flat.T) / 2
    np.fill_diagonal(flat, 0)
    assert layer_clustering(flat, layers, permutations=200, seed=0)["p_value"] > 0.01


def test_mds_recovers_planar_distances():
    rng = np.random.default_rng(1)
    pts = rng.normal(size=(12, 2))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    coords, stress = mds_embedding(d, seed=0, n_init=2, max_iter=500)
    got = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    np.testing.assert_allclose(got, d, atol=1e-3)


def test_mds_tables_of_the_rule():
    rng = np.random.default_rng(2)
    layers = np.repeat(np.arange(2), 3)
    pts = np.array([[0.0, 0.0], [10.0, 0.0]])[layers] + rng.normal(size=(6, 2)) * 0.1
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    long = distance_long(d * 7, 2, 3, "m", n_tokens=7)  # the long table holds sums over 7 tokens
    long["n_sequences"], long["n_tokens"] = 2, 7
    behaviour = pd.DataFrame(
        {"model": "m", "layer": layers, "head": np.tile(np.arange(3), 2), "label": ["broad", "next", "prev"] * 2}
    )
    heads, table, stats = mds_tables(long, behaviour, "m", seed=0, n_init=2, max_iter=300, permutations=50)
    assert heads["label"].tolist() == ["broad", "next", "prev"] * 2 and list(heads.columns[-2:]) == ["mds_x", "mds_y"]
    got = np.linalg.norm(
        heads[["mds_x", "mds_y"]].to_numpy()[:, None] - heads[["mds_x", "mds_y"]].to_numpy()[None], axis=-1
    )
    np.testing.assert_allclose(got, d, atol=1e-2)
    assert (
        table["n_sequences"].iloc[0] == 2
        and table["n_tokens"].iloc[0] == 7
        and table["within_layer"].iloc[0] < table["between_layer"].iloc[0]
    )
    assert stats["within_layer"] == table["within_layer"].iloc[0]
    assert "heads_sampled" not in table
    keep = np.array([0, 2, 3, 5])  # a sample of two heads per layer: its rows only, and the counts
    sub = distance_long(d[np.ix_(keep, keep)] * 7, 2, 3, "m", n_tokens=7, heads=keep)
    sub["n_sequences"], sub["n_tokens"] = 2, 7
    heads, table, _ = mds_tables(sub, behaviour, "m", seed=0, n_init=2, max_iter=300, permutations=50)
    assert (heads["layer"] * 3 + heads["head"]).tolist() == keep.tolist()
    assert heads["label"].tolist() == ["broad", "prev", "broad", "prev"]
    assert (table["heads_sampled"].iloc[0], table["heads_total"].iloc[0]) == (4, 6)
