"""What the shared golden run shows as a whole (conftest's ``golden_results``: the tiny configuration through every
analysis of the default config, acceptance/test_golden.run_tiny): the atlas and Pande's tables of both models, the
ablation rules, the fused route giving the same tables, the atlas page in Chromium, no clipped figure. All slow:
the run takes about 10 minutes on two cores, once per session."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from figure_ink import clipped_figures
from unit.atlas.test_atlas_page import CHROMIUM, _artifacts, drive_page
from unit.test_fused import _tables_close

from headatlas.atlas import page as pg
from headatlas.core.store import AttentionStore
from headatlas.pande.hypothesis import COLUMNS, STABILITY_COLUMNS


@pytest.mark.slow
def test_tiny_models_through_every_analysis(golden_results):
    """clark_surface, pande, clark_syntax, jomyaeng and the atlas on the tiny BERT and GPT-2
    (the default config's analysis block, corpora cut by tests/tiny_workflow.py), built from a checkout that
    holds a finished run's results/ (files there that the tiny run must neither read nor depend on:
    test_golden.run_tiny)."""
    res = golden_results
    for model in ("tinybert", "tinygpt2"):
        atlas = pd.read_csv(res / "atlas" / model / "atlas.tsv", sep="\t")
        assert len(atlas) == 2 * 4 and (atlas["model"] == model).all()
        assert sorted(zip(atlas["layer"], atlas["head"])) == [(a, b) for a in range(2) for b in range(4)]
        for col in ("clark_behaviour", "pande_local_effect", "pande_local_sig_fdr", "pande_local_stability_fdr", "pande_local_corpus_share_faithful",
                    "syntax_all_accuracy", "probe_syntactic_mean_acc"):  # fmt: skip
            assert col in atlas.columns, (model, col)
        stab = atlas.filter(like="_stability_").to_numpy(dtype=float)
        assert ((stab >= 0) & (stab <= 1) | np.isnan(stab)).all()
        ag = pd.read_csv(res / "atlas" / model / "agreement.tsv", sep="\t")
        assert len(ag) and ag["n_heads"].le(8).all()
        ok = ag["ci_low"].notna()
        assert (ag.loc[ok, "ci_low"] <= ag.loc[ok, "ci_high"]).all()
        for f in ("atlas.png", "agreement.png", "profile.tsv", "relation_heads.tsv"):
            assert (res / "atlas" / model / f).stat().st_size > 0
        heads = pd.read_csv(res / "pande" / model / "heads.tsv", sep="\t")
        assert list(heads.columns) == COLUMNS + STABILITY_COLUMNS
        by_corpus = pd.read_csv(res / "pande" / model / "heads_by_corpus.tsv", sep="\t")
        assert len(by_corpus) == len(heads) * by_corpus["corpus"].nunique() and by_corpus["corpus"].nunique() == 3
        assert (res / "pande" / model / "length.png").stat().st_size > 0
    assert [p for p in res.rglob("*") if ".tmp" in p.name] == []


@pytest.mark.slow
def test_tiny_workflow_ablation(golden_results):
    """The real rules on the tiny workflow's models (the golden run, test_golden.run_tiny): heads, check,
    roles, pruning and the atlas columns."""
    res = golden_results
    heads = pd.read_csv(res / "ablation/tinygpt2/heads.tsv", sep="\t")
    lm = heads[heads["task"] == "lm"]
    assert len(lm) == 8 and (lm["status"] == "ok").all()
    bert = pd.read_csv(res / "ablation/tinybert/heads.tsv", sep="\t")
    assert (bert["status"] == "skipped").all()
    assert "no masked-LM head" in (res.parent / "logs/ablation_heads/tinybert.log").read_text()
    roles = pd.read_csv(res / "ablation/tinygpt2/roles.tsv", sep="\t")
    assert "status" in roles
    atlas = pd.read_csv(res / "atlas/tinybert/atlas.tsv", sep="\t")
    assert atlas["ablation_lm_loss_method"].str.startswith("skipped").all()
    assert atlas["ablation_lm_loss_effect_kind"].str.startswith("skipped").all()
    gpt = pd.read_csv(res / "atlas/tinygpt2/atlas.tsv", sep="\t")
    assert (gpt["ablation_lm_loss_effect_kind"] == "exact").all()
    assert (res / "ablation/tinygpt2/removable.tsv").is_file()
    for m in ("tinybert", "tinygpt2"):
        assert (res / f"ablation/{m}/pruning.svg").is_file()


@pytest.mark.slow
def test_tiny_workflow_fused_gives_the_full_tables(tmp_path, golden_results):
    """The tiny workflow's Clark surface and Pande with wiki reduced fused (maps: sample, 4 kept) and sick
    (maps: none) give the tables of the golden run, which stores every map (the atlas excepted: the golden run's
    has every analysis's columns)."""
    from conftest import run_snakemake
    from tiny_workflow import REPO, write_tiny

    config = write_tiny(tmp_path, analyses=["clark_surface", "pande"], maps="config", sample=4)
    (tmp_path / "resources").symlink_to(REPO / "resources")
    env = {"PYTHONPATH": str(REPO / "scripts"), "HF_HUB_OFFLINE": "1"}
    proc = run_snakemake(tmp_path, None, "--configfile", str(config), "--quiet", timeout=None, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = tmp_path / "results"
    fused = results / "attention" / "tinygpt2" / "wiki" / "shard0of1"
    assert (fused / "reduced" / "pande_sieves.h5").is_file() and (fused / "sample" / "manifest.json").is_file()
    with AttentionStore(fused / "sample") as s:
        assert len(s) == 4
    assert not (results / "attention" / "tinygpt2" / "sick" / "shard0of1" / "sample").exists()
    assert len(list((results / "pande").rglob("*.tsv"))) > 5 and len(list((results / "clark").rglob("*.tsv"))) > 5
    assert _tables_close(results, golden_results, skip=("atlas",)) == []


@pytest.mark.slow
def test_page_in_chromium_tiny_run(golden_results):
    """The page of the tiny workflow run (the golden configuration) in headless Chromium."""
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium); CI installs it in .ci/run")
    results = golden_results
    html = results / "atlas" / "index.html"
    assert html.is_file()
    data = pg.read_embedded(html.read_text(encoding="utf-8"))
    models = [m["model"] for m in data["models"]]
    assert models and all(m["examples"]["sentences"] for m in data["models"]), [
        m["examples"]["note"] for m in data["models"]
    ]
    (_artifacts() / "tiny_index.html").write_bytes(html.read_bytes())
    drive_page(html, {m: results / "atlas" / m / "atlas.tsv" for m in models}, "tiny")


@pytest.mark.slow
def test_no_figure_of_the_tiny_run_is_clipped(golden_results):
    """Every PNG of the shared tiny run (every analysis) keeps its ink off the edge."""
    pngs = list(golden_results.rglob("*.png"))
    assert pngs
    assert clipped_figures(golden_results) == {}
