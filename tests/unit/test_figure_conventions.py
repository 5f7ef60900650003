"""One orientation for every layers x heads figure (layer 1 at the top, head 1 at the left, 1-based
labels) and widths the report can show (core.figures)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from headatlas.core.figures import MAX_WIDTH_IN, layer_head_axes, layer_ticks, panel_columns  # noqa: E402

L, H = 3, 4


def test_layer_ticks_are_1_based():
    assert layer_ticks(3) == ([0, 1, 2], ["1", "2", "3"])
    assert layer_ticks(30)[1][:3] == ["1", "3", "5"]
    assert layer_ticks(48)[1][:2] == ["1", "6"]


def test_layer_head_axes_puts_layer_1_on_top_and_head_1_left():
    fig, ax = plt.subplots()
    layer_head_axes(ax, L, H)
    assert ax.get_ylim() == (L - 0.5, -0.5)  # y grows downwards: row 0 (layer 1) at the top
    assert ax.get_xlim() == (-0.5, H - 0.5)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4"]
    assert "1-based" in ax.get_ylabel() and "1-based" in ax.get_xlabel()
    plt.close(fig)


def test_panel_columns_keep_figures_within_the_report_width():
    assert panel_columns(10, 3.1) == 3 and 3 * 3.1 <= MAX_WIDTH_IN
    assert panel_columns(2, 4.0) == 2
    assert panel_columns(2, 8.0) == 1
    assert panel_columns(1, 30.0) == 1
    assert panel_columns(10, 1.0) == 5  # at most five


@pytest.fixture
def captured(monkeypatch):
    """Figures handed to save_figure by each figures module, kept open for inspection."""
    figs = []

    def keep(fig, png, svg):
        figs.append(fig)

    import headatlas.atlas.figures as af
    import headatlas.jomyaeng.figures as jf
    import headatlas.pande.figures as pf

    for mod in (af, jf, pf):
        monkeypatch.setattr(mod, "save_figure", keep)
    yield figs
    for f in figs:
        plt.close(f)


def grid_axes(fig):
    """Axes of a figure that draw a layers x heads grid (their y label names the layer)."""
    return [ax for ax in fig.axes if ax.get_ylabel().startswith("layer")]


def assert_oriented(fig, n_layers=L):
    axes = grid_axes(fig)
    assert axes
    for ax in axes:
        lo, hi = ax.get_ylim()
        assert lo > hi, f"{ax.get_title()}: layer 1 is not at the top"
        assert ax.get_yticklabels()[0].get_text() == "1"
        assert max(int(t.get_text()) for t in ax.get_yticklabels()) == n_layers


def heads_frame():
    return pd.DataFrame([(layer, head) for layer in range(L) for head in range(H)], columns=["layer", "head"])


def test_atlas_grid(captured):
    from headatlas.atlas.figures import atlas_grid

    atlas_grid(heads_frame().assign(clark_behaviour="broad"), L, H, "m", "a.png", "a.svg")
    assert_oriented(captured[0])


def test_pande_role_grid_and_heatmap(captured):
    from headatlas.pande.figures import heatmap_figure, role_grid

    rng = np.random.default_rng(0)
    t = pd.concat([heads_frame().assign(role=r) for r in ("local", "syntactic")], ignore_index=True)
    t = t.assign(model="m", tau=3.0, n=10, mean=rng.uniform(0.5, 8, len(t)), p=0.01)
    t["significant_faithful"] = t["mean"] > 3
    t["significant_fdr"] = t["mean"] > 4
    role_grid(t, "g.png", "g.svg")
    heatmap_figure(t, "h.png", "h.svg")
    for fig in captured:
        assert_oriented(fig)


def test_jomyaeng_heatmaps(captured):
    from headatlas.jomyaeng.figures import heatmaps

    rng = np.random.default_rng(0)
    h = pd.concat([heads_frame().assign(task=t) for t in ("A", "B")], ignore_index=True)
    h = h.assign(metric="accuracy", test_acc=rng.uniform(0, 1, len(h)))
    heatmaps(h, ["A", "B"], "j.png", "j.svg", "m", sort=False)
    assert_oriented(captured[0])


def test_clark_syntax_grids():
    from headatlas.clark.syntax_figures import plot_coref_heads, plot_head_grid

    h = pd.concat([heads_frame().assign(relation=r) for r in ("All", "nsubj")], ignore_index=True)
    h = h.assign(direction="dep->head", n=5, accuracy=np.linspace(0, 1, len(h)))
    c = heads_frame().assign(split="all", type="all", n=5, accuracy=0.5)
    for fig in (plot_head_grid(h, ["All", "nsubj"], "m", "ewt"), plot_coref_heads(c, "m", "gum")):
        assert_oriented(fig)
        plt.close(fig)
