"""The head atlas: joins per head, method agreement, relative depth (hand-made tables)."""

import numpy as np
import pandas as pd
import pytest

from headatlas.atlas import analysis as at

L, H = 2, 3


def heads():
    layer, head = np.divmod(np.arange(L * H), H)
    return layer, head


def pande_table(effect_syntactic, sig_syntactic):
    layer, head = heads()
    rows = []
    for role in ["local", "syntactic", "syntactic_nsubj"]:
        eff = effect_syntactic if role != "local" else np.full(L * H, 0.5)
        sig = sig_syntactic if role != "local" else np.zeros(L * H, bool)
        for i in range(L * H):
            rows.append(
                {
                    "model": "m",
                    "layer": layer[i],
                    "head": head[i],
                    "role": role,
                    "effect": eff[i],
                    "significant_faithful": bool(sig[i]),
                    "significant_fdr": bool(sig[i]),
                }
            )
    return pd.DataFrame(rows)


def syntax_tables(acc_all, acc_nsubj):
    layer, head = heads()
    rows = []
    for rel, acc in (("All", acc_all), ("nsubj", acc_nsubj)):
        for d, shift in (("dep->head", 0.0), ("head->dep", -0.1)):
            rows += [
                {
                    "model": "m",
                    "layer": layer[i],
                    "head": head[i],
                    "relation": rel,
                    "direction": d,
                    "n": 100,
                    "accuracy": acc[i] + shift,
                }
                for i in range(L * H)
            ]
    base = pd.DataFrame(
        [
            {"model": "m", "relation": r, "offset": k, "n": 100, "accuracy": a}
            for r in ("All", "nsubj")
            for k, a in ((-1, 0.2), (1, 0.3))
        ]
    )
    return pd.DataFrame(rows), base


def test_grid_and_labels_are_one_based_when_printed():
    g = at.grid(L, H)
    assert list(g["label"]) == ["1-1", "1-2", "1-3", "2-1", "2-2", "2-3"]


def test_build_atlas_joins_every_table_per_head():
    acc = np.array([0.1, 0.2, 0.9, 0.4, 0.5, 0.6])
    syntax, base = syntax_tables(acc, acc)
    pande = pande_table(np.arange(6) / 6, np.array([0, 0, 1, 0, 0, 0], bool))
    a = at.build_atlas("m", L, H, {"pande": pande, "syntax": syntax, "syntax_baselines": base})
    assert len(a) == L * H and (a["model"] == "m").all()
    # the better direction, margin over the best offset baseline (0.3)
    assert a.loc[2, "syntax_all_accuracy"] == pytest.approx(0.9)
    assert a.loc[2, "syntax_best_relation"] == "nsubj"
    assert a.loc[2, "syntax_best_margin"] == pytest.approx(0.6)
    assert a.loc[2, "syntax_best_direction"] == "dep->head"
    assert a["pande_syntactic_sig_fdr"].tolist() == [False, False, True, False, False, False]
    assert a.loc[5, "pande_syntactic_effect"] == pytest.approx(5 / 6)


def test_missing_tables_leave_columns_out():
    a = at.build_atlas("m", L, H, {"pande": None, "probes": None})
    assert list(a.columns) == ["model", "layer", "head", "label"]


def test_head_outside_the_grid_is_an_error():
    bad = pande_table(np.zeros(6), np.zeros(6, bool))
    bad.loc[0, "layer"] = 5
    with pytest.raises(ValueError, match="outside the 2 x 3 grid"):
        at.build_atlas("m", L, H, {"pande": bad})


def test_probe_columns_and_category_means():
    layer, head = heads()
    rows = [
        {"model": "m", "layer": layer[i], "head": head[i], "task": t, "test_acc": a, "selectivity": a - 0.5}
        for i in range(6)
        for t, a in (("TreeDepth", 0.2), ("BigramShift", 0.6), ("Tense", 0.9))
    ]
    a = at.build_atlas("m", L, H, {"probes": pd.DataFrame(rows)})
    assert a["probe_syntactic_mean_acc"].tolist() == pytest.approx([0.4] * 6)
    assert a["probe_semantic_mean_acc"].tolist() == pytest.approx([0.9] * 6)
    assert a["probe_Tense_selectivity"].tolist() == pytest.approx([0.4] * 6)


def test_agreement_identical_rankings_give_rho_one_and_full_overlap():
    acc = np.array([0.1, 0.2, 0.9, 0.4, 0.5, 0.6])
    syntax, base = syntax_tables(acc, acc)
    pande = pande_table(acc * 10, np.zeros(6, bool))  # same ranking as Clark's accuracy
    a = at.build_atlas("m", L, H, {"pande": pande, "syntax": syntax, "syntax_baselines": base})
    scores = at.method_scores(a, syntax, ["nsubj"])
    ag = at.agreement_table(scores, "m", k=2, n_boot=200, seed=0)
    row = ag[(ag.method_a == "clark_syntax") & (ag.method_b == "pande_syntactic")].iloc[0]
    assert row.spearman == pytest.approx(1.0)
    assert row.ci_low == pytest.approx(1.0) and row.ci_high == pytest.approx(1.0)
    assert row.top_k_overlap == 2 and row.top_k_jaccard == 1.0
    assert row.top_k_chance == pytest.approx(4 / 6)
    rel = ag[ag.method_a == "clark_nsubj"].iloc[0]
    assert rel.method_b == "pande_nsubj" and rel.spearman == pytest.approx(1.0)


def test_agreement_reversed_rankings_and_seeded_bootstrap():
    x = np.arange(20, dtype=float)
    rho, lo, hi, p, n = at.spearman_ci(x, -x, 300, 1)
    assert rho == pytest.approx(-1.0) and n == 20
    rng = np.random.default_rng(0)
    y = x + rng.normal(0, 5, 20)
    assert at.spearman_ci(x, y, 300, 7) == at.spearman_ci(x, y, 300, 7)
    r2 = at.spearman_ci(x, y, 300, 7)
    assert r2[1] <= r2[0] <= r2[2]
    assert at.topk_overlap(x, -x, 5)[0] == 0


def test_relation_heads_vs_sieve():
    acc = np.array([0.1, 0.2, 0.9, 0.4, 0.5, 0.6])
    syntax, base = syntax_tables(acc, acc)
    pande = pande_table(acc, np.array([0, 0, 1, 0, 0, 1], bool))
    a = at.build_atlas("m", L, H, {"pande": pande, "syntax": syntax, "syntax_baselines": base})
    t = at.relation_heads_vs_sieve(a, syntax, ["nsubj"], 2, "m").iloc[0]
    assert t.clark_best_head == "1-3" and t.best_is_sieve_significant
    assert t.top_k_share_significant == pytest.approx(1.0)  # top 2 by accuracy: heads 2 and 5
    assert t.all_heads_share_significant == pytest.approx(2 / 6)


def test_relative_depth_and_layer_profiles():
    assert at.relative_depth(np.arange(4), 4).tolist() == [0.125, 0.375, 0.625, 0.875]
    pande = pande_table(np.zeros(6), np.array([1, 1, 0, 0, 0, 0], bool))
    a = at.build_atlas("m", L, H, {"pande": pande})
    prof = at.layer_profiles(a, L)
    assert prof["share_syntactic"].tolist() == pytest.approx([2 / 3, 0.0])
    assert prof["relative_depth"].tolist() == [0.25, 0.75]


def test_atlas_grid_figure_for_large_models(tmp_path):
    from headatlas.atlas.figures import atlas_grid

    for n_layers, n_heads in ((24, 16), (30, 9)):
        a = at.grid(n_layers, n_heads)
        a["clark_behaviour"] = np.where(a["layer"] < 2, "broad", "sep")
        a["pande_local_sig_fdr"] = a["head"] == 0
        path = tmp_path / f"g{n_layers}.png"
        atlas_grid(a, n_layers, n_heads, "m", path, path.with_suffix(".svg"))
        assert path.stat().st_size > 10_000


def test_legend_lists_bos_or_cls_not_both():
    from headatlas.atlas.figures import legend_behaviours

    assert "bos" not in legend_behaviours(["cls", "other"]) and "cls" in legend_behaviours(["cls"])
    dec = legend_behaviours(["bos", "prev", "other"])
    assert "bos" in dec and "cls" not in dec and "broad" in dec


def test_registry_declares_every_table_once_and_in_join_order():
    assert at.TABLE_NAMES == [
        "behaviour",
        "mds",
        "pande",
        "syntax",
        "syntax_baselines",
        "coref",
        "probes",
        "detectors",
        "ablation",
        "circuits",
        "fv_heads",
        "quiet",
    ]
    assert {s.analysis for s in at.ATLAS_SOURCES} == {
        "clark_surface",
        "pande",
        "clark_syntax",
        "jomyaeng",
        "detectors",
        "ablation",
        "circuits",
        "icl",
        "quiet",
    }
    settings = {"surface_corpus": "wiki"}
    behaviour = at.ATLAS_SOURCES[0]
    assert at.source_inputs(behaviour, "m", True, ["ewt", "wiki"], settings) == {
        "behaviour": "results/clark/m/wiki/behaviour.tsv"
    }
    assert at.source_inputs(behaviour, "m", True, ["ewt"], settings) == {}  # the surface corpus is not analysed
    assert at.source_inputs(behaviour, "m", False, ["wiki"], settings) == {}  # the analysis does not cover m
    pande = next(s for s in at.ATLAS_SOURCES if s.name == "pande")
    assert at.source_inputs(pande, "m", True, [], settings) == {}  # no analysed corpus extracted for m
    syntax = next(s for s in at.ATLAS_SOURCES if s.name == "syntax")
    assert list(at.source_inputs(syntax, "m", True, None, settings)) == ["syntax", "syntax_baselines"]


def test_atlas_tables_of_the_rule():
    acc = np.array([0.1, 0.2, 0.9, 0.4, 0.5, 0.6])
    syntax, base = syntax_tables(acc, acc)
    pande = pande_table(np.arange(6) / 6, np.array([0, 0, 1, 0, 0, 0], bool))
    settings = at.AtlasSettings.from_config(
        {"relations": ["nsubj"], "bootstrap": 100, "seed": 1, "surface_corpus": "wiki"}
    )
    assert settings.relations == ("nsubj",) and settings.top_k == 0
    t = at.atlas_tables("m", L, H, {"pande": pande, "syntax": syntax, "syntax_baselines": base}, settings)
    assert set(t) == {"atlas", "agreement", "relations", "profile", "scores"}
    assert t["atlas"].equals(at.build_atlas("m", L, H, {"pande": pande, "syntax": syntax, "syntax_baselines": base}))
    assert (t["profile"]["model"] == "m").all() and len(t["profile"]) == L
    assert t["relations"]["relation"].tolist() == ["nsubj"]
    with pytest.raises(TypeError):
        at.AtlasSettings("wiki")  # keyword-only


def test_cross_model_figures_one_per_family(tmp_path):
    from headatlas.atlas.figures import cross_model_figures

    profile = pd.DataFrame(
        {"relative_depth": [0.25, 0.75], "share_local": [0.5, 0.0], "share_behaviour_broad": [0.1, 0.2]}
    )
    families = ("pande", "clark", "probing", "detectors")
    paths = {f: tmp_path / f"{f}.png" for f in families} | {f"{f}_svg": tmp_path / f"{f}.svg" for f in families}
    cross_model_figures({"a": profile, "b": profile}, paths)
    assert all(p.stat().st_size > 1000 for p in paths.values())  # probing: a panel saying no model has it
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(f"{f}.{e}" for f in families for e in ("png", "svg"))


def test_ladder_table_counts_by_hand():
    """Two layers x two heads: induction in layer 1 only, one retrieval head that is the induction head, one FV
    head elsewhere; the second model has no detectors, circuits or ICL columns (NaN, not 0)."""
    a = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
            "det_prev_sig": [True, False, False, False], "det_induction_sig": [False, False, True, False],
            "det_sink_head": [True, True, False, None], "circ_retrieval": [0.0, 0.05, 0.4, np.nan],
            "icl_top": [True, False, False, False],
        }
    )  # fmt: skip
    b = pd.DataFrame({"layer": [0, 0, 0], "head": [0, 1, 2], "icl_top": [None] * 3, "circ_retrieval": [np.nan] * 3})
    ag = pd.DataFrame(
        {"method_a": ["clark_syntax", "clark_syntax"], "method_b": ["pande_syntactic", "jm_syntactic"],
         "spearman": [0.6, 0.1], "ci_low": [0.5, 0.0], "ci_high": [0.7, 0.2]}
    )  # fmt: skip
    t = at.ladder_table({"a": a, "b": b}, {"a": ag}).set_index("model")
    assert t.loc["a", ["n_layers", "n_heads", "heads"]].tolist() == [2, 2, 4]
    assert t.loc["a", "prev_share"] == 0.25 and t.loc["a", "induction_share"] == 0.25
    assert t.loc["a", "induction_heads"] == 1 and t.loc["a", "induction_depth"] == 0.75
    assert t.loc["a", "sink_head_share"] == pytest.approx(2 / 3)  # the empty cell is missing, not False
    assert t.loc["a", "retrieval_scored"] == 3 and t.loc["a", "retrieval_share"] == pytest.approx(1 / 3)
    assert t.loc["a", "retrieval_induction"] == 1
    assert t.loc["a", "fv_top_heads"] == 1 and t.loc["a", "fv_top_induction"] == 0
    assert t.loc["a", ["clark_pande_spearman", "clark_pande_ci_low", "clark_pande_ci_high"]].tolist() == [0.6, 0.5, 0.7]
    assert t.loc["b", "heads"] == 3
    empty = [
        "prev_share",
        "retrieval_share",
        "retrieval_heads",
        "fv_top_heads",
        "fv_top_induction",
        "clark_pande_spearman",
    ]
    assert t.loc["b", empty].isna().all()  # an encoder: the ICL analysis skipped, no retrieval run


def test_layer_profile_has_detector_and_retrieval_shares():
    a = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "det_induction_sig": [False, False, True, True],
         "circ_retrieval": [0.0, 0.2, 0.0, np.nan]}
    )  # fmt: skip
    p = at.layer_profiles(a, 2)
    assert p["share_det_induction"].tolist() == [0.0, 1.0]
    assert p["share_retrieval"].tolist() == [0.5, 0.0]
    assert "share_det_prev" not in p
