"""No figure is clipped: every PNG a figure function or the workflow writes keeps its ink off the image
edge (tests/figure_ink.py). The figures with ``layout="constrained"`` move their axes only when drawn, so a
bounding box taken before the layout runs cuts them (the atlas grid lost its first heads and layer axis)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from figure_ink import clipped_figures, edge_ink  # noqa: E402

from headatlas.core.figures import save_figure  # noqa: E402

L, H = 6, 12  # MiniLM's grid: the size of the figure that was clipped


def heads_frame(n_layers=L, n_heads=H) -> pd.DataFrame:
    return pd.DataFrame([(la, h) for la in range(n_layers) for h in range(n_heads)], columns=["layer", "head"])


def test_edge_ink_sees_ink_on_each_edge(tmp_path):
    fig = plt.figure(figsize=(2, 1))
    save_figure(fig, tmp_path / "blank.png", tmp_path / "blank.svg")
    assert edge_ink(tmp_path / "blank.png") == []
    img = np.ones((20, 30, 3))
    img[0, 5] = 0.9  # a light grey pixel on the top row
    img[7, -1] = (1.0, 0.0, 0.0)  # red on the right column
    plt.imsave(tmp_path / "ink.png", img)
    assert edge_ink(tmp_path / "ink.png") == ["top", "right"]
    img[5:8, 5:8] = 0  # ink inside only
    img[0, 5] = img[7, -1] = 1.0
    plt.imsave(tmp_path / "inside.png", img)
    assert edge_ink(tmp_path / "inside.png") == []
    assert clipped_figures(tmp_path) == {"ink.png": ["top", "right"]}
    (tmp_path / "ci-artifacts" / "page").mkdir(parents=True)  # browser screenshots fill their frame
    plt.imsave(tmp_path / "ci-artifacts" / "page" / "shot.png", img * 0)
    assert clipped_figures(tmp_path) == {"ink.png": ["top", "right"]}
    assert "ci-artifacts/page/shot.png" in clipped_figures(tmp_path, skip=())


def test_constrained_layout_figure_is_saved_after_its_layout(tmp_path):
    """A constrained figure whose axes labels lie outside the axes' initial place (the case save_figure cut)."""
    fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
    for ax in axes:
        ax.imshow(np.random.default_rng(0).uniform(size=(L, H)))
        ax.set_ylabel("layer (1-based; 1 = first)\nsecond line", fontsize=14)
        ax.set_xlabel("head (1-based)", fontsize=14)
    fig.suptitle("a title", fontsize=14)
    save_figure(fig, tmp_path / "c.png", tmp_path / "c.svg")
    assert edge_ink(tmp_path / "c.png") == []


def atlas_table(n_layers=L, n_heads=H) -> pd.DataFrame:
    """Every family the grid draws (behaviours, Pande roles with their corpus shares, J&M text, frames, detectors,
    ablation values of each kind): the full legends of a run's atlas."""
    rng = np.random.default_rng(0)
    a = heads_frame(n_layers, n_heads)
    n = len(a)
    a["clark_behaviour"] = rng.choice(["broad", "prev", "sep", "other"], n)
    for r in ("local", "delimiter", "syntactic", "block"):
        a[f"pande_{r}_sig_fdr"] = rng.uniform(size=n) > 0.5
        a[f"pande_{r}_corpus_share_fdr"] = rng.uniform(size=n)
    for c in ("surface", "syntactic", "semantic"):
        a[f"probe_{c}_mean_acc"] = rng.uniform(size=n)
    a["syntax_best_margin"] = rng.uniform(-0.1, 0.2, n)
    for d in ("prev", "duplicate", "induction"):
        a[f"det_{d}"] = rng.uniform(size=n)
        a[f"det_{d}_sig"] = a[f"det_{d}"] > 0.5
    a["det_sink_head"] = rng.uniform(size=n) > 0.8
    a["det_kv_group"] = a["head"] // 3
    a["ablation_lm_loss_effect"] = rng.normal(0, 0.1, n)
    a["ablation_lm_loss_effect_kind"] = rng.choice(["exact", "estimated (checked)", "unreliable"], n)
    return a


def detector_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    from headatlas.detectors.registry import REGISTRY

    rng = np.random.default_rng(1)
    parts = [
        heads_frame().assign(detector=d, input=REGISTRY[d].main_input, kv_group=lambda t: t["head"] // 4)
        for d in ("prev", "duplicate", "induction")
    ]
    heads = pd.concat(parts, ignore_index=True)
    heads["mean"] = rng.uniform(size=len(heads))
    heads["significant"] = heads["mean"] > 0.5
    sinks = pd.DataFrame(
        [(str(la), i, rng.uniform(), 0.3) for i in ("natural", "repeated") for la in [*range(L), "all"]],
        columns=["layer", "input", "sink_head_share", "epsilon"],
    )
    return heads, sinks


def composition_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(2)
    heads = heads_frame(30, 9)  # SmolLM2's shape: the panels one above the other
    rows = [(a, b, c, d) for a in range(3) for b in range(9) for c in range(a + 1, 5) for d in range(9)]
    pairs = pd.DataFrame(rows, columns=["writer_layer", "writer_head", "reader_layer", "reader_head"])
    for m in ("q", "k", "v"):
        pairs[f"comp_{m}_z"] = rng.normal(size=len(pairs))
    return pairs, heads


def pande_table() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    t = pd.concat([heads_frame().assign(role=r) for r in ("local", "syntactic", "delimiter", "block")])
    t = t.reset_index(drop=True).assign(model="m", tau=3.0, n=10, p=0.01)
    t["mean"] = rng.uniform(0.5, 8, len(t))
    t["significant_faithful"] = t["mean"] > 3
    t["significant_fdr"] = t["mean"] > 4
    return t


def draw_atlas(png, svg):
    from headatlas.atlas.figures import atlas_grid

    atlas_grid(atlas_table(), L, H, "minilm", png, svg)


def draw_tall_atlas(png, svg):
    """SmolLM2's 30 x 9 grid: equal-aspect panels whose constrained layout moves again at every draw."""
    from headatlas.atlas.figures import atlas_grid

    atlas_grid(atlas_table(30, 9), 30, 9, "smollm2", png, svg)


def draw_detectors(png, svg):
    from headatlas.detectors.figures import detector_figure

    detector_figure(*detector_tables(), "minilm", png, svg)


def draw_composition(png, svg):
    from headatlas.circuits.figures import composition_figure

    pairs, heads = composition_tables()
    composition_figure(pairs, heads, None, "smollm2", 8, png, svg)


def draw_pande(png, svg):
    from headatlas.pande.figures import heatmap_figure

    heatmap_figure(pande_table(), png, svg)


@pytest.mark.parametrize(
    "draw", [draw_atlas, draw_tall_atlas, draw_detectors, draw_composition, draw_pande], ids=lambda f: f.__name__
)
def test_constrained_figures_keep_their_ink_inside(tmp_path, draw):
    draw(tmp_path / "f.png", tmp_path / "f.svg")
    assert edge_ink(tmp_path / "f.png") == [], f"{draw.__name__}: ink on the image edge (clipped)"
    assert (tmp_path / "f.svg").stat().st_size > 0
