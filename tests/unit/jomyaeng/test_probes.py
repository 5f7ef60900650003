"""Batched SentEval-style probes: exactness against one-at-a-time and torch.optim references."""

from __future__ import annotations

import numpy as np
import pytest

from headatlas.jomyaeng.probes import (
    ProbeConfig,
    pair_features,
    relatedness_targets,
    senteval_loop,
    train_probes,
    train_probes_loop,
)

SIZES = {"train": 500, "dev": 150, "test": 150}


def planted(P=6, d=12, C=3, seed=0, strength=None):
    """Features where probe p sees the label with strength[p] (0 = pure noise)."""
    rng = np.random.default_rng(seed)
    strength = np.linspace(0.0, 2.0, P) if strength is None else np.asarray(strength)
    X, y = {}, {}
    for s, n in SIZES.items():
        y[s] = rng.integers(0, C, n)
        X[s] = rng.normal(size=(P, n, d)).astype(np.float32)
        X[s][:, np.arange(n), y[s]] += strength[:, None]
    return X, y


def test_linearly_separable_task_reaches_100_percent():
    # four classes on the corners of a square (margin 2), uniform noise of at most 0.9 per axis
    rng = np.random.default_rng(1)
    corners = np.array([[2, 2], [2, -2], [-2, 2], [-2, -2]], dtype=float)
    X, y = {}, {}
    for s, n in SIZES.items():
        y[s] = rng.integers(0, 4, n)
        X[s] = np.concatenate([corners[y[s]] + rng.uniform(-0.9, 0.9, (n, 2)), rng.normal(size=(n, 6))], 1)
    r = train_probes(X, y)
    assert r.test[0] == 1.0 and r.dev[0] == 1.0


def test_batched_equals_one_at_a_time():
    X, y = planted()
    batched = train_probes(X, y)
    single = train_probes_loop(X, y)
    np.testing.assert_array_equal(batched.dev_grid, single.dev_grid)
    np.testing.assert_array_equal(batched.test_grid, single.test_grid)
    np.testing.assert_array_equal(batched.epochs, single.epochs)
    np.testing.assert_array_equal(batched.l2, single.l2)
    # stronger signal, better probe: the planted gradient is recovered
    assert batched.test[-1] > 0.75 and batched.test[0] < 0.5


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_matches_senteval_with_torch_optim(optimizer):
    """Equal to SentEval's classifier (nn.Linear, autograd, torch.optim, deepcopy of the best
    model), one probe and one L2 value at a time."""
    X, y = planted(P=2, strength=[0.4, 1.5])
    cfg = ProbeConfig(optimizer=optimizer, l2=(1e-5, 1e-2), max_epoch=30, dtype="float64")
    r = train_probes(X, y, cfg)
    ref = senteval_loop(X, y, cfg)
    np.testing.assert_allclose(r.dev_grid, ref.dev_grid, atol=1e-12)
    np.testing.assert_allclose(r.test_grid, ref.test_grid, atol=1e-12)
    np.testing.assert_array_equal(r.epochs, ref.epochs)
    assert not np.allclose(r.dev_grid[0], r.dev_grid[1])  # the two probes did differ


def test_l2_chosen_on_rounded_dev_first_wins():
    X, y = planted(P=4)
    r = train_probes(X, y)
    for p in range(4):
        k = int(np.argmax(np.round(100 * r.dev_grid[p], 2)))
        assert r.l2[p] == ProbeConfig().l2[k]
        assert r.test[p] == r.test_grid[p, k]


def test_shuffled_labels_stay_at_chance():
    X, y = planted(P=4, strength=[3.0, 3.0, 3.0, 3.0])
    rng = np.random.default_rng(7)
    shuffled = {s: rng.permutation(v) for s, v in y.items()}
    r = train_probes(X, shuffled)
    # 3 balanced classes, 150 test items: chance 1/3, sd ~ 0.04
    assert np.all(np.abs(r.test - 1 / 3) < 0.13), r.test
    assert train_probes(X, y).test.min() > 0.85


def test_relatedness_targets_and_pearson_metric():
    t, values = relatedness_targets(np.array([1.0, 2.4, 5.0, 3.0]))
    np.testing.assert_allclose(t.sum(1), 1.0)
    np.testing.assert_allclose(t @ values, [1.0, 2.4, 5.0, 3.0])
    assert t[1, 1] == pytest.approx(0.6) and t[1, 2] == pytest.approx(0.4)
    with pytest.raises(ValueError):
        relatedness_targets(np.array([0.5]))
    rng = np.random.default_rng(3)
    X, y = {}, {}
    for s, n in SIZES.items():
        score = rng.uniform(1, 5, n)
        X[s] = np.stack([score + rng.normal(scale=0.1, size=n), rng.normal(size=n)], 1)[None].repeat(2, 0)
        X[s][1] = rng.normal(size=(n, 2))  # probe 1: noise
        y[s] = relatedness_targets(score)[0]
    r = train_probes(X, y, ProbeConfig(max_epoch=100), values=values)
    assert r.test[0] > 0.9 and abs(r.test[1]) < 0.3


def test_pair_features():
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 4.0]])
    np.testing.assert_array_equal(pair_features(u, v), [[2.0, 6.0, 3.0, -8.0]])


def test_bad_inputs_are_named():
    X, y = planted(P=2)
    with pytest.raises(ValueError, match="optimizer"):
        ProbeConfig(optimizer="sgd")
    with pytest.raises(ValueError, match=r"analysis\.jomyaeng\.probe\.momentum: unknown setting"):
        ProbeConfig.from_config({"lr": 0.1, "momentum": 0.9})
    bad = dict(y, dev=y["dev"][:-1])
    with pytest.raises(ValueError, match="dev"):
        train_probes(X, bad)
    with pytest.raises(ValueError, match="labels must lie"):
        train_probes(X, y, n_classes=2)


def test_standardize_rescues_tiny_variation_on_a_large_offset():
    """[CLS]-like features: a large constant plus a tiny label signal. SentEval's raw
    features leave the probe at chance; z-scored ones expose the signal."""
    X, y = planted(P=1, strength=[2.0])
    tiny = {s: 8.0 + 1e-3 * X[s] for s in X}
    raw = train_probes(tiny, y, ProbeConfig(standardize=False))
    std = train_probes(tiny, y, ProbeConfig(standardize=True))
    assert raw.test[0] < 0.45 and std.test[0] > 0.8
    np.testing.assert_allclose(std.test, train_probes(X, y, ProbeConfig(standardize=True)).test, atol=0.02)
