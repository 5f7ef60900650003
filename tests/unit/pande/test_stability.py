"""Stability of the heads-hypothesis labels (per-corpus tests, stratified bootstrap), the
score-against-length figure, and every Pande and atlas table/figure on degenerate statistics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.pande import figures as pf
from headatlas.pande.hypothesis import (
    COLUMNS,
    STABILITY_COLUMNS,
    HypothesisSettings,
    corpus_shares,
    head_table,
    one_sided_t,
    resampled_t,
    stability_shares,
    stratified_counts,
)

# --- vectorised bootstrap t-tests ----------------------------------------------------------------


def test_resampled_t_equals_the_t_test_of_the_resampled_data():
    rng = np.random.default_rng(0)
    x = rng.normal(3.2, 1.0, (30, 5))
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:, 4] = 4.0  # constant: t = +inf, p = 0
    counts = stratified_counts(1, [30], ["c"], 7)
    got = resampled_t(counts, x, 3.0, ddof=0)
    for b in range(7):
        rep = np.repeat(x, counts[b].astype(int), axis=0)
        ref = one_sided_t(rep, 3.0, 0)
        np.testing.assert_allclose(got["p"][b], ref["p"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got["mean"][b], ref["mean"], rtol=1e-12)
        np.testing.assert_array_equal(got["n"][b], ref["n"])
    assert (got["p"][:, 4] == 0).all()
    ones = resampled_t(np.ones((1, 30)), x, 3.0, 1)
    np.testing.assert_allclose(ones["p"][0], one_sided_t(x, 3.0, 1)["p"], rtol=1e-9)


def test_stratified_counts_stay_within_each_corpus_and_are_seeded():
    c = stratified_counts(0, [4, 6], ["a", "b"], 50)
    assert c.shape == (50, 10)
    assert (c[:, :4].sum(1) == 4).all() and (c[:, 4:].sum(1) == 6).all()
    np.testing.assert_array_equal(c, stratified_counts(0, [4, 6], ["a", "b"], 50))
    assert not np.array_equal(c, stratified_counts(1, [4, 6], ["a", "b"], 50))
    # a corpus's draws do not depend on the other corpora
    np.testing.assert_array_equal(stratified_counts(0, [6], ["b"], 50), c[:, 4:])


def test_stability_shares_strong_absent_and_borderline_heads():
    rng = np.random.default_rng(0)
    n = 40
    x = np.column_stack([
        rng.normal(6.0, 1.0, n),  # always significant
        rng.normal(1.0, 1.0, n),  # never
        rng.normal(3.0, 1.0, n) + 0.33,  # borderline: p near alpha
        np.r_[5.0, np.full(n - 1, np.nan)],  # one sentence: no test
    ])  # fmt: skip
    s = HypothesisSettings(stability_resamples=300)
    f, q = stability_shares(x, [25, 15], ["a", "b"], s)
    assert f[0] == 1.0 and q[0] == 1.0
    assert f[1] == 0.0 and q[1] == 0.0
    assert 0.1 < f[2] < 0.9, f
    assert np.isnan(f[3]) and np.isnan(q[3])
    again = stability_shares(x, [25, 15], ["a", "b"], s)
    np.testing.assert_array_equal(f, again[0])
    for bad in (HypothesisSettings(stability_resamples=0), HypothesisSettings(tau=0, stability_resamples=10)):
        assert np.isnan(stability_shares(x, [25, 15], ["a", "b"], bad)[0]).all()
    with pytest.raises(ValueError, match="add up"):
        stability_shares(x, [20, 15], ["a", "b"], s)
    with pytest.raises(ValueError, match="stability_resamples"):
        HypothesisSettings(stability_resamples=-1)


def test_corpus_shares_count_only_corpora_with_a_test():
    rows = []
    for corpus, sig, p in (("a", True, 0.01), ("b", False, 0.5), ("c", False, np.nan)):
        rows.append(
            {
                "corpus": corpus,
                "layer": 0,
                "head": 0,
                "role": "local",
                "p": p,
                "significant_faithful": sig,
                "significant_fdr": sig,
            }
        )
        rows.append(
            {
                "corpus": corpus,
                "layer": 0,
                "head": 0,
                "role": "block",
                "p": np.nan,
                "significant_faithful": False,
                "significant_fdr": False,
            }
        )
    s = corpus_shares(pd.DataFrame(rows)).set_index("role")
    assert s.loc["local", "corpus_share_faithful"] == 0.5 and s.loc["local", "corpora_tested"] == 2
    assert np.isnan(s.loc["block", "corpus_share_fdr"]) and s.loc["block", "corpora_tested"] == 0


# --- per-corpus tests end to end from score files ----------------------------------------------


def write_scores(path, scores, corpus, model="toy", lengths=None):
    from headatlas.pande.analysis import save_scores

    n = len(scores)
    result = {"scores": scores.astype(np.float32), "pair_counts": np.zeros((n, 1), np.int64), "is_pair": np.zeros(n, bool),
              "record_id": [f"{corpus}{i}" for i in range(n)], "roles": ["local", "block"], "relations": [], "notes": {}}  # fmt: skip
    if lengths is not None:
        result["lengths"] = lengths
    save_scores(path, result, {"model": model, "corpus": corpus})


def two_corpora(tmp_path):
    """Head 0 is local on long inputs only (score n / 5), head 1 everywhere, head 2 nowhere; block has no sentence."""
    rng = np.random.default_rng(0)
    paths = []
    for name, lo, hi, k in (("short", 8, 14, 30), ("long", 40, 60, 20)):
        n = rng.integers(lo, hi, k)
        s = np.full((k, 1, 3, 2), np.nan)
        s[:, 0, 0, 0] = n / 5 + rng.normal(0, 0.2, k)
        s[:, 0, 1, 0] = 8 + rng.normal(0, 1, k)
        s[:, 0, 2, 0] = 1 + rng.normal(0, 0.1, k)
        paths.append(tmp_path / f"{name}.h5")
        write_scores(paths[-1], s, name, lengths=n)
    return paths


def test_model_table_pooled_per_corpus_and_stability(tmp_path):
    from headatlas.pande.analysis import load_scores, model_table, read_table, write_table

    paths = two_corpora(tmp_path)
    settings = HypothesisSettings(bootstrap=50, permutations=50, stability_resamples=100)
    table, by_corpus = model_table(paths, "toy", settings)
    assert list(table.columns) == COLUMNS + STABILITY_COLUMNS
    # the pooled columns are the faithful pooled test, untouched
    pooled = np.concatenate([load_scores(p)["scores"] for p in paths])
    pd.testing.assert_frame_equal(table[COLUMNS], head_table(pooled, ["local", "block"], "toy", settings))
    assert list(by_corpus.columns) == ["model", "corpus"] + COLUMNS[1:]
    loc = by_corpus[by_corpus["role"] == "local"].set_index(["corpus", "head"])
    assert loc.loc[("long", 0), "significant_faithful"] and not loc.loc[("short", 0), "significant_faithful"]
    assert loc.loc[("short", 0), "n"] == 30 and loc.loc[("long", 0), "n"] == 20
    t = table.set_index(["role", "head"])
    assert t.loc[("local", 0), "significant_faithful"]  # pooled: carried by the long corpus
    assert t.loc[("local", 0), "corpus_share_faithful"] == 0.5 and t.loc[("local", 0), "corpora_tested"] == 2
    assert t.loc[("local", 1), "corpus_share_faithful"] == 1.0 and t.loc[("local", 1), "stability_faithful"] == 1.0
    assert t.loc[("local", 2), "stability_faithful"] == 0.0
    assert np.isnan(t.loc[("block", 0), "stability_faithful"]) and t.loc[("block", 0), "corpora_tested"] == 0
    write_table(table, tmp_path / "heads.tsv")
    back = read_table(tmp_path / "heads.tsv")
    assert back["significant_faithful"].dtype == bool and np.isnan(back.loc[1, "stability_fdr"])
    with pytest.raises(ValueError, match="given twice"):
        model_table([paths[0], paths[0]], "toy", settings)


def test_length_table_and_trend_by_hand(tmp_path):
    from headatlas.pande.analysis import length_analysis, model_table, write_table

    paths = two_corpora(tmp_path)
    table, _ = model_table(paths, "toy", HypothesisSettings(bootstrap=10, permutations=10, stability_resamples=10))
    write_table(table, tmp_path / "heads.tsv")
    out = {k: tmp_path / f"length.{k}" for k in ("table", "trend")}
    out["figure"], out["figure_svg"] = tmp_path / "length.png", tmp_path / "length.svg"
    trend = length_analysis(paths, tmp_path / "heads.tsv", out, n_bins=4, top=1)
    assert out["figure"].stat().st_size > 5000 and b"<svg" in out["figure_svg"].read_bytes()
    bins = pd.read_csv(out["table"], sep="\t")
    assert set(bins["pick"]) == {"strongest 1", "median"} and set(bins["role"]) == {"local"}
    strong = bins[bins["pick"] == "strongest 1"]
    assert (strong["head"] == 1).all()  # pooled mean 8 beats head 0's
    med = bins[bins["pick"] == "median"]
    assert (med["head"] == 0).all()
    assert med.groupby("corpus")["sentences"].sum().to_dict() == {"long": 20, "short": 30}
    # head 0 scores n / 5: its bin means follow the bin's mean length
    np.testing.assert_allclose(med["mean_score"], med["mean_length"] / 5, atol=0.2)
    tr = trend.set_index(["corpus", "role"])
    assert tr.loc[("long", "local"), "heads"] == 3 and np.isnan(tr.loc[("long", "block"), "median_spearman"])


def test_length_table_exact_bins():
    scores = np.array([1.0, 2.0, 3.0, 10.0, np.nan])[:, None, None, None]
    lengths = np.array([10, 12, 19, 20, 20])
    picks = pd.DataFrame([{"role": "local", "pick": "median", "layer": 0, "head": 0, "head_mean": 4.0}])
    t = pf.length_table(scores, lengths, np.array([0, 0, 0, 1, 1]), ["a", "b"], ["local"], picks, n_bins=2)
    assert pf.length_bin_edges(lengths, 2).tolist() == [10, 16, 21]
    assert t[["corpus", "bin_low", "sentences"]].values.tolist() == [["a", 10, 2], ["a", 16, 1], ["b", 16, 1]]
    assert t["mean_score"].tolist() == [1.5, 3.0, 10.0]
    assert t["mean_length"].tolist() == [11.0, 19.0, 20.0]


def test_old_score_file_without_lengths_is_a_clear_error(tmp_path):
    from headatlas.pande.analysis import length_analysis

    write_scores(tmp_path / "old.h5", np.ones((3, 1, 1, 2)), "c")
    with pytest.raises(ValueError, match="old.h5: no 'lengths'"):
        length_analysis([tmp_path / "old.h5"], tmp_path / "none.tsv", {})


# --- degenerate statistics: every Pande and atlas table and figure copes ------------------------


def degenerate_pande(model="m", n_layers=2, n_heads=3):
    """A heads table where local has no head significant, delimiter is constant (t = inf, p = 0),
    block is all NA (no sentence), syntactic has estimates outside their CIs and NaN stability."""
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            base = {"model": model, "layer": layer, "head": head, "tau": 3.0, "df": 9.0, "sd": 1.0, "effect_ci_low": np.nan, "effect_ci_high": np.nan,
                    "p_nonparam": np.nan, "p_nonparam_adj": np.nan, "significant_nonparam_fdr": False, "note": ""}  # fmt: skip
            rows.append({**base, "role": "local", "n": 10, "mean": 1.0, "ci_low": 0.9, "ci_high": 1.1, "statistic": -5.0, "p": 1.0, "p_adj": 1.0,
                         "significant_faithful": False, "significant_fdr": False})  # fmt: skip
            rows.append({**base, "role": "delimiter", "n": 10, "mean": 5.0, "sd": 0.0, "ci_low": 5.0, "ci_high": 5.0, "statistic": np.inf, "p": 0.0,
                         "p_adj": 0.0, "significant_faithful": True, "significant_fdr": True, "note": "zero variance"})  # fmt: skip
            rows.append({**base, "role": "block", "n": 0, "mean": np.nan, "sd": np.nan, "ci_low": np.nan, "ci_high": np.nan, "statistic": np.nan,
                         "df": np.nan, "p": np.nan, "p_adj": np.nan, "significant_faithful": False, "significant_fdr": False, "note": "no pairs"})  # fmt: skip
            rows.append({**base, "role": "syntactic", "n": 3, "mean": 4.0, "ci_low": 4.5, "ci_high": 6.0, "statistic": 2.0, "p": 0.04 + 0.1 * head,
                         "p_adj": 0.2, "significant_faithful": head == 0, "significant_fdr": False})  # fmt: skip
    t = pd.DataFrame(rows)
    t["effect"] = t["mean"] / 3
    t = t[COLUMNS]
    t["stability_faithful"] = np.where(t["role"] == "delimiter", 1.0, np.where(t["role"] == "block", np.nan, 0.3))
    t["stability_fdr"] = t["stability_faithful"]
    t["corpus_share_faithful"] = np.where(t["role"] == "block", np.nan, 0.5)
    t["corpus_share_fdr"] = t["corpus_share_faithful"]
    t["corpora_tested"] = np.where(t["role"] == "block", 0, 2)
    return t


def test_pande_figures_cope_with_degenerate_tables(tmp_path):
    from headatlas.pande.analysis import figures, finetune_comparison, write_table

    t = degenerate_pande()
    write_table(t, tmp_path / "heads.tsv")
    out = {k: tmp_path / f"{k}.{ext}" for k, ext in (("grid", "png"), ("grid_svg", "svg"), ("colocation", "tsv"), ("colocation_png", "png"),
                                                     ("colocation_svg", "svg"), ("layers", "tsv"), ("layers_png", "png"), ("layers_svg", "svg"), ("pvalues", "png"),
                                                     ("pvalues_svg", "svg"), ("heatmap", "png"), ("heatmap_svg", "svg"), ("summary", "json"))}  # fmt: skip
    summary = figures(tmp_path / "heads.tsv", out)
    counts = {r["role"]: r for r in summary["roles"]}
    assert counts["local"]["faithful"] == 0 and counts["block"]["tested"] == 0 and counts["delimiter"]["faithful"] == 6
    for p in out.values():
        assert p.stat().st_size > 0, p
    coloc = pd.read_csv(out["colocation"], sep="\t")
    row = coloc[(coloc["mode"] == "faithful") & (coloc["role_a"] == "local") & (coloc["role_b"] == "syntactic")].iloc[0]
    assert row["both"] == 0 and np.isnan(row["share_of_a"])  # no local head: share undefined, not an error
    # an all-NA table (tau <= 0) and a model without any label
    empty = t.assign(
        mean=np.nan,
        effect=np.nan,
        p=np.nan,
        p_adj=np.nan,
        statistic=np.nan,
        significant_faithful=False,
        significant_fdr=False,
    )
    write_table(empty, tmp_path / "empty.tsv")
    figures(tmp_path / "empty.tsv", out)
    # fine-tuning comparison between a degenerate and an empty table
    (tmp_path / "tuned").mkdir()
    from headatlas.core.finetune import METRICS_FILE

    (tmp_path / "tuned" / METRICS_FILE).write_text(
        '{"task": "sst2", "steps": 1, "dev_accuracy": 0.5, "majority_baseline": 0.5}'
    )
    write_table(empty.assign(model="m2"), tmp_path / "tuned.tsv")
    finetune_comparison(tmp_path / "heads.tsv", tmp_path / "tuned.tsv", tmp_path / "tuned",
                        {"table": tmp_path / "cmp.tsv", "roles": tmp_path / "cmp.png", "roles_svg": tmp_path / "cmp.svg",
                         "sep": tmp_path / "sep.png", "sep_svg": tmp_path / "sep.svg"})  # fmt: skip
    assert (tmp_path / "sep.png").stat().st_size > 0 and (tmp_path / "sep.svg").stat().st_size > 0


def test_length_figure_with_no_scores(tmp_path):
    empty = pf.length_table(
        np.zeros((0, 1, 1, 2)),
        np.zeros(0),
        np.zeros(0, int),
        ["a"],
        ["local", "block"],
        pf.picked_heads(degenerate_pande()),
    )
    assert empty.empty
    pf.length_figure(empty, ["local", "block"], tmp_path / "l.png", tmp_path / "l.svg", "m", 3.0)
    assert pf.picked_heads(degenerate_pande().assign(mean=np.nan)).empty
    assert (tmp_path / "l.png").stat().st_size > 0


def atlas_inputs_degenerate():
    """Clark syntax accuracies that are constant on 'All' and NaN on amod, plus the degenerate Pande table."""
    rows = []
    for layer in range(2):
        for head in range(3):
            for rel, acc in (("All", 0.3), ("nsubj", 0.1 * (layer * 3 + head)), ("amod", np.nan)):
                for d in ("dep->head", "head->dep"):
                    rows.append(
                        {
                            "model": "m",
                            "layer": layer,
                            "head": head,
                            "relation": rel,
                            "direction": d,
                            "n": 5,
                            "accuracy": acc,
                        }
                    )
    base = pd.DataFrame(
        [{"model": "m", "relation": r, "offset": 1, "n": 5, "accuracy": 0.2} for r in ("All", "nsubj", "amod")]
    )
    return pd.DataFrame(rows), base


def test_atlas_carries_stability_and_copes_with_degenerate_inputs(tmp_path):
    from headatlas.atlas import analysis as at
    from headatlas.atlas.figures import agreement_figure, atlas_grid, cross_model_figure, stability_alpha

    pande = degenerate_pande()
    syntax, base = atlas_inputs_degenerate()
    a = at.build_atlas("m", 2, 3, {"pande": pande, "syntax": syntax, "syntax_baselines": base})
    assert a["pande_delimiter_stability_fdr"].tolist() == [1.0] * 6
    assert a["pande_syntactic_corpus_share_faithful"].tolist() == [0.5] * 6
    assert a["pande_block_stability_fdr"].isna().all()  # a role without a test keeps its column, NA
    # the existing columns come first, in their old order
    old = at.build_atlas("m", 2, 3, {"pande": pande[[c for c in COLUMNS if c not in at.PANDE_EFFECT_CI]]})
    assert list(a.columns[: len(old.columns)]) == list(old.columns)
    cols = [c for c in a.columns if c.startswith("pande_")]
    assert cols[: len([c for c in old.columns if c.startswith("pande_")])] == [
        c for c in old.columns if c.startswith("pande_")
    ]
    assert not a["pande_local_sig_fdr"].any()  # no head holds local
    scores = at.method_scores(a, syntax, ["nsubj", "amod"])
    ag = at.agreement_table(scores, "m", 2, 100, 0)
    assert (
        ag.set_index("method_a").loc["clark_syntax", "spearman"]
        != ag.set_index("method_a").loc["clark_syntax", "spearman"]
    )  # constant: NaN
    # an estimate outside its percentile interval (the tinygpt2 crash) and a NaN row
    forced = pd.concat(
        [ag, ag.iloc[[-1]].assign(method_a="clark_obj", method_b="pande_obj", spearman=0.9, ci_low=-0.2, ci_high=0.5)],
        ignore_index=True,
    )
    forced.loc[forced["method_a"] == "clark_amod", ["spearman", "ci_low", "ci_high"]] = np.nan
    agreement_figure(scores, forced, "m", tmp_path / "agreement.png", tmp_path / "agreement.svg")
    atlas_grid(a, 2, 3, "m", tmp_path / "atlas.png", tmp_path / "atlas.svg")
    prof = at.layer_profiles(a, 2)
    assert prof["share_local"].tolist() == [0.0, 0.0] and prof["share_delimiter"].tolist() == [1.0, 1.0]
    cross_model_figure(
        {"m": prof, "n": prof.assign(share_local=np.nan)},
        [("share_local", "local"), ("share_block", "block")],
        "t",
        "share",
        tmp_path / "x.png",
        tmp_path / "x.svg",
    )
    for p in ("agreement.png", "atlas.png", "x.png", "agreement.svg", "atlas.svg", "x.svg"):
        assert (tmp_path / p).stat().st_size > 0
    assert (
        stability_alpha(1.0) == 1.0
        and stability_alpha(0.0) == pytest.approx(0.2)
        and stability_alpha(np.nan) == 1.0
        and stability_alpha(None) == 1.0
    )


def test_atlas_script_writes_well_formed_tables_with_nan(tmp_path):
    """The atlas tables written with NaN stay readable (NA cells, one row per head)."""
    from headatlas.atlas import analysis as at

    a = at.build_atlas("m", 2, 3, {"pande": degenerate_pande()})
    a.to_csv(tmp_path / "atlas.tsv", sep="\t", index=False, float_format="%.6g")
    back = pd.read_csv(tmp_path / "atlas.tsv", sep="\t")
    assert len(back) == 6 and back["pande_block_stability_faithful"].isna().all()


# --- end to end: the tiny models through every analysis of the default config ------------------


def test_config_keys_have_schema_defaults_and_reach_the_settings():
    import yaml
    from tiny_workflow import REPO

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "pande.schema.yaml").read_text())["properties"]
    assert schema["stability_resamples"]["default"] == 200 and schema["stability_resamples"]["minimum"] == 0
    assert schema["length_bins"]["default"] == 8 and schema["length_heads"]["default"] == 3
    assert HypothesisSettings.pick({"stability_resamples": 7, "near_p": 0.1}).stability_resamples == 7
    assert "tests=settings_params(HypothesisSettings, PANDE)" in (REPO / "workflow" / "rules" / "pande.smk").read_text()
    # an empty corpus draws nothing and leaves the others' draws alone
    c = stratified_counts(0, [0, 3], ["a", "b"], 4)
    assert c.shape == (4, 3) and (c.sum(1) == 3).all()
    np.testing.assert_array_equal(c, stratified_counts(0, [3], ["b"], 4))
