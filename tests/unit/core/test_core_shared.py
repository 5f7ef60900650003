"""The helpers every analysis shares: head_label, save_figure, bootstrap_ci (headatlas.core)."""

import numpy as np
import pytest

from headatlas.core.bootstrap import bootstrap_ci, resample_counts
from headatlas.core.figures import DPI, head_label, save_figure


def test_head_label_is_one_based():
    assert head_label(7, 10) == "8-11"
    assert head_label(np.int64(0), 2.0) == "1-3"


def test_save_figure_writes_png_and_svg_atomically(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    save_figure(fig, tmp_path / "a.png", tmp_path / "a.svg")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]  # no temporary left
    assert not plt.fignum_exists(fig.number)
    with pytest.raises(TypeError):
        save_figure(fig, tmp_path / "c.png")  # one policy: every figure has both
    from PIL import Image

    assert round(Image.open(tmp_path / "a.png").info["dpi"][0]) == DPI


def test_save_figure_leaves_nothing_when_drawing_fails(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, r"$\notacommand$")  # mathtext fails only when drawn
    with pytest.raises(ValueError):
        save_figure(fig, tmp_path / "b.png", tmp_path / "b.svg")
    assert list(tmp_path.iterdir()) == []


def test_resample_counts_rows_sum_to_n():
    c = resample_counts(np.random.default_rng(0), 7, 5)
    assert c.shape == (5, 7) and (c.sum(1) == 7).all()


def test_per_item_bootstrap_by_hand():
    # three resamples of three items, given as counts: means 6/3 = 2, 6/3 = 2 and 7/3
    x = np.array([1.0, 2.0, 4.0])
    counts = np.array([[2.0, 0.0, 1.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
    lo, hi = bootstrap_ci(x, n_boot=3, level=0.0, counts=counts)  # level 0: both ends are the median
    assert lo[0] == hi[0] == 2.0
    lo, hi = bootstrap_ci(x, n_boot=3, level=1.0, counts=counts)  # level 1: min and max of the resample means
    assert (lo[0], hi[0]) == (2.0, pytest.approx(7 / 3))


def test_clustered_bootstrap_pools_within_clusters():
    # clusters 0 (1 of 3 right) and 1 (2 of 2 right); drawing cluster 0 twice gives 2/6, cluster 1 twice 4/4
    correct = np.array([1, 0, 0, 1, 1], dtype=float)
    clusters = np.array([5, 5, 5, 9, 9])
    counts = np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    lo, hi = bootstrap_ci(correct, n_boot=3, level=1.0, clusters=clusters, counts=counts)
    assert (lo[0], hi[0]) == (pytest.approx(1 / 3), 1.0)
    # the per-item interval of the same values differs: clustering is not ignored
    lo_i, _ = bootstrap_ci(correct, n_boot=200, level=0.95, rng=np.random.default_rng(0))
    lo_c, _ = bootstrap_ci(correct, n_boot=200, level=0.95, rng=np.random.default_rng(0), clusters=clusters)
    assert lo_i[0] != lo_c[0]


def test_per_item_equals_clustered_with_singleton_clusters():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3))
    a = bootstrap_ci(x, n_boot=300, rng=np.random.default_rng(1))
    b = bootstrap_ci(x, n_boot=300, rng=np.random.default_rng(1), clusters=np.arange(40))
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_bootstrap_degenerate_cases():
    lo, hi = bootstrap_ci(np.array([]), n_boot=10, rng=np.random.default_rng(0))
    assert np.isnan(lo[0]) and np.isnan(hi[0])
    lo, hi = bootstrap_ci(np.ones(4), n_boot=0, rng=np.random.default_rng(0))
    assert np.isnan(lo[0])
    with pytest.raises(ValueError, match="rng or counts"):
        bootstrap_ci(np.ones(4), n_boot=5)


def test_local_band_offsets():
    from headatlas.core.patterns import local_band

    assert list(local_band(2, causal=False)) == [-2, -1, 0, 1, 2]
    assert list(local_band(2, causal=True)) == [-2, -1, 0]
    assert list(local_band(0, causal=False)) == [0]
