"""Clark's syntax reducers without maps (headatlas.clark.syntax_reducers' map-free forms): word-level maps from
the units' value columns, the coreference rows from the anaphors' head-word pieces (query_rows), equal to the
eager-fused reference on the tiny models (both word modes) and, marked slow, on MiniLM and SmolLM2; argmax
predictions identical except ties, which are counted and bounded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import RESOURCES, TINY_NAMES

from headatlas.clark.syntax_reducers import (
    UNITS,
    CorefReducer,
    HeadPredictionReducer,
    WordMapsReducer,
    _BatchAnaphors,
    anaphor_pieces,
    anaphor_rows,
    batch_anaphors,
    batch_units,
    view_word_maps,
)
from headatlas.core.corpora import document_records, read_conllu
from headatlas.core.data import SPECIAL_CLS, SPECIAL_SEP
from headatlas.core.extract import tokenize_records
from headatlas.core.mapfree import FreeLayer, attention_lse, plan_feed
from headatlas.core.models import decoder_bos, model_kind
from headatlas.core.reduce import fused_reduce
from headatlas.core.reducer import ReduceBatch
from unit.clark.test_syntax_reducers import batch_word_maps

TOL = 1e-5
GUM_DEV = RESOURCES / "gum" / "ontogum_dev.conllu"
MODES = ("mean", "first")


@pytest.fixture(scope="session")
def gum_docs():
    return document_records(read_conllu(GUM_DEV))[:4]


def _hand_batch():
    """[CLS] a b ##b c [SEP] and [CLS] x y [SEP] (padded to 6)."""
    rows = [
        {"word": np.array([-1, 0, 1, 1, 2, -1]), "special": np.array([SPECIAL_CLS, 0, 0, 0, 0, SPECIAL_SEP]),
         "segment": np.zeros(6, int), "piece": np.array(["[CLS]", "a", "b", "##b", "c", "[SEP]"], dtype=object)},
        {"word": np.array([-1, 0, 1, -1]), "special": np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP]),
         "segment": np.zeros(4, int), "piece": np.array(["[CLS]", "x", "y", "[SEP]"], dtype=object)},
    ]  # fmt: skip
    return ReduceBatch.from_rows([0, 1], rows, [0, 1], [3, 2])


def _hand_layer(causal, seed=2):
    """(FreeLayer of random q, k over the hand batch with grouped heads and the UNITS columns of both
    modes, the explicit softmax maps [B, H, n, n] with padded rows 0)."""
    torch.manual_seed(seed)
    batch = _hand_batch()
    bsz, h, hk, n, d, scale = 2, 6, 3, 6, 8, 0.35
    q, k = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2
    masks = batch.masks("cpu", causal)
    seen = masks["allowed"] | ~masks["valid"][:, :, None]  # padded query rows: any finite row
    add = torch.zeros(bsz, 1, n, n).masked_fill(~seen[:, None], -math.inf)
    a = torch.softmax(q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2) * scale + add, -1)
    a = a * masks["allowed"][:, None]
    to = torch.as_tensor(batch_units(batch, "mean").to)  # [B, n, U]
    am, lse = attention_lse(q, k, to[:, None].expand(bsz, hk, n, -1), add, False, scale)
    return FreeLayer(q, k, lse, scale, batch, causal, {UNITS: am}, {}, None), a


@pytest.mark.parametrize("causal", [False, True])
def test_query_rows_equal_softmax_rows(causal):
    """query_rows gives the explicit softmax's rows of scattered queries (grouped heads, padding, the causal
    mask, -1 slots), and 0 outside the visible cells."""
    view, a = _hand_layer(causal)
    query = np.array([[4, 0, 2, -1], [3, 1, -1, -1]])
    got = view.query_rows(query)
    for b in range(2):
        for p, i in enumerate(query[b]):
            want = a[b, :, i] if i >= 0 else torch.zeros_like(a[b, :, 0])
            torch.testing.assert_close(got[b, :, p], want, rtol=0, atol=2e-6)  # float32: scores up to ~20 nats


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
def test_free_word_maps_and_anaphor_rows_equal_the_maps(causal, mode):
    """The word-level maps of a FreeLayer (value columns + the query side) and anaphor_rows (the head words'
    pieces' rows) equal those of the explicit maps; word b of the first sequence has two pieces."""
    view, a = _hand_layer(causal)
    batch = view.batch
    units = batch_units(batch, mode)
    want = batch_word_maps(a, batch, causal, mode)
    torch.testing.assert_close(view_word_maps(view, batch, mode), want, rtol=0, atol=1e-6)
    seq, head = np.array([0, 0, 1, 0]), np.array([2, 1, 2, -1])  # units: [CLS] a b c [SEP]; [CLS] x y [SEP]
    an = _BatchAnaphors(seq, head, head, np.ones((4, units.frm.shape[1]), bool), [[0, 1, 3], [2]])
    got = anaphor_rows(view, batch, units, an)
    torch.testing.assert_close(got[:3], want[seq[:3], :, head[:3]], rtol=0, atol=1e-6)
    assert (got[3] == 0).all()  # a head word without pieces
    slots = int((anaphor_pieces(batch, units, an).query >= 0).sum())
    assert slots == (4 if mode == "mean" else 3)


def _word_rows(maps, units, b):
    """[2, K, W, W] the word rows' maps of sequence b in both directions (self excluded as -inf)."""
    idx = units.word_unit[b, : units.n_rows[b]]
    m = maps[:, idx][:, :, idx]
    m = np.where(np.eye(len(idx), dtype=bool), -np.inf, m)
    return np.stack([m, m.transpose(0, 2, 1)])


def check_heads(eager, free, word_maps, tokenized, batch_of, mode):
    """Table 1's predictions: identical except where the eager word maps' two words are within TOL (a tie to
    float32 rounding); returns (differing, ties eager, ties free)."""
    for key in ("record_index", "n_words", "row_offset", "word"):
        np.testing.assert_array_equal(getattr(eager, key), getattr(free, key), err_msg=key)
    differ = eager.pred != free.pred
    for i in range(eager.n_sequences):
        a, b = eager.row_offset[i], eager.row_offset[i + 1]
        if not differ[:, :, a:b].any():
            continue
        units = batch_units(batch_of(i), mode)
        s = _word_rows(word_maps.word_maps(i).maps, units, 0)  # [2, K, W, W]
        for d, k, r in zip(*np.nonzero(differ[:, :, a:b])):
            pe, pf = int(eager.pred[d, k, a + r]), int(free.pred[d, k, a + r])
            ve = s[d, k, r, pe] if pe >= 0 else 0.0
            vf = s[d, k, r, pf] if pf >= 0 else 0.0
            assert abs(ve - vf) <= TOL, (i, d, k, r, ve, vf)
    return int(differ.sum()), int(eager.ties.sum()), int(free.ties.sum())


def single_batch(tokenized, records):
    return lambda i: ReduceBatch.from_tokenized(tokenized, [i], records)


def run_both(model, tokenized, reducers, kind, records, pad, name, batch_size=4, cpu_pass="auto"):
    assert plan_feed(model, reducers(), max(len(t) for t in tokenized))[0] == "mapfree"
    eager = fused_reduce(model, tokenized, reducers(), batch_size, kind, records, pad, name, path="eager")
    free = fused_reduce(
        model, tokenized, reducers(), batch_size, kind, records, pad, name, path="mapfree", cpu_pass=cpu_pass
    )
    return eager, free


def check_syntax(model, tokenized, kind, records, pad, name, mode, batch_size=4, cpu_pass="auto"):
    """Table 1 and Table 3 inputs, eager vs map-free: word maps within TOL, predictions identical except ties.
    Returns (predictions, differing, ties eager, ties free, max word-map difference)."""
    reducers = lambda: [HeadPredictionReducer(mode), WordMapsReducer(mode)]  # noqa: E731
    (eh, ew), (fh, fw) = run_both(model, tokenized, reducers, kind, records, pad, name, batch_size, cpu_pass)
    for key in ("record_index", "n_words", "unit_offset", "unit_word", "unit_special", "map_offset", "lower"):
        np.testing.assert_array_equal(getattr(ew, key), getattr(fw, key), err_msg=key)
    err = float(np.abs(ew.maps - fw.maps).max())
    assert err <= TOL
    differ, te, tf = check_heads(eh, fh, ew, tokenized, single_batch(tokenized, records), mode)
    return eh.pred.size, differ, te, tf, err


def check_coref(model, tokenized, kind, docs, pad, name, mode, batch_size=2, cpu_pass="auto"):
    """Table 2's input, eager vs map-free: identical except where the eager word maps' two candidates are
    within TOL. Returns (predictions, differing, ties eager, ties free)."""
    (ec, ew), (fc, _) = run_both(
        model,
        tokenized,
        lambda: [CorefReducer(mode), WordMapsReducer(mode)],
        kind,
        docs,
        pad,
        name,
        batch_size,
        cpu_pass,
    )
    for key in ("record_index", "n_words", "anaphor_offset", "head", "has_pieces"):
        np.testing.assert_array_equal(getattr(ec, key), getattr(fc, key), err_msg=key)
    assert len(ec.head) > 0 and ec.has_pieces.any()
    differ = ec.pred != fc.pred
    for k, a in zip(*np.nonzero(differ)):
        i = int(np.searchsorted(ec.anaphor_offset, a, side="right") - 1)
        wm = ew.word_maps(i)
        unit_of = {int(w): u for u, w in enumerate(wm.unit_word) if w >= 0}
        row = wm.maps[k, unit_of[int(ec.head[a])]]
        vals = [row[unit_of[int(p)]] if p >= 0 else 0.0 for p in (ec.pred[k, a], fc.pred[k, a])]
        assert abs(vals[0] - vals[1]) <= TOL, (k, a, vals)
    return ec.pred.size, int(differ.sum()), int(ec.ties.sum()), int(fc.ties.sum())


def _tiny(tiny_loaded, name, records, max_length=None):
    spec, model, tok, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    n = max_length or spec.max_length
    tokenized, _ = tokenize_records(records, tok, kind, n, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return model, tokenized, kind, pad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", TINY_NAMES)
@pytest.mark.parametrize("cpu_pass", ["auto", "off"])
def test_tiny_syntax_mapfree_equals_eager(name, mode, cpu_pass, tiny_loaded, ewt_records):
    """Head predictions (Table 1) and word maps (Table 3) on 12 EWT sentences, encoders and decoders, with the
    CPU attention pass and without (off: the Python a GPU runs)."""
    recs = list(ewt_records[:12])
    model, tokenized, kind, pad = _tiny(tiny_loaded, name, recs)
    total, differ, te, tf, err = check_syntax(model, tokenized, kind, recs, pad, name, mode, cpu_pass=cpu_pass)
    print(f"{name} {mode}: {total} predictions, {differ} differ, ties {te} eager / {tf} map-free, maps {err:.1e}")
    assert differ <= max(te, tf) + total // 1000, (differ, te, tf)  # near-ties only, checked one by one above


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_coref_mapfree_equals_eager(name, mode, tiny_loaded, gum_docs):
    """Coreference predictions (Table 2) on 4 GUM documents: the anaphors' rows alone, no extra pass."""
    model, tokenized, kind, pad = _tiny(tiny_loaded, name, gum_docs, 256)  # the tiny models' longest input
    assert CorefReducer(mode).layer_needs(ReduceBatch.from_tokenized(tokenized, [0], gum_docs), False).values == {}
    batch = ReduceBatch.from_tokenized(tokenized, range(len(tokenized)), gum_docs)
    units = batch_units(batch, mode)
    qp = anaphor_pieces(batch, units, batch_anaphors(batch, units))
    an = batch_anaphors(batch, units)
    slots, heads = int((qp.query >= 0).sum()), int((an.head_unit >= 0).sum())
    assert slots > heads if mode == "mean" else slots == heads  # head words of several pieces
    total, differ, te, tf = check_coref(model, tokenized, kind, gum_docs, pad, name, mode)
    print(f"{name} {mode}: {total} coref predictions, {differ} differ, ties {te} eager / {tf} map-free")
    assert differ <= max(te, tf) + total // 1000, (differ, te, tf)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_real_syntax_mapfree_equals_eager(name, tmp_path_factory, capsys, gum_docs):
    """MiniLM and SmolLM2 (real weights): Tables 1 and 3 inputs on 48 EWT dev sentences (128 tokens, both word
    modes), Table 2's on two GUM documents at 512 tokens; word maps within 1e-5, predictions identical
    except near-ties (checked one by one against the eager maps), counted."""
    from conftest import EWT_DEV

    from headatlas.core.corpora import sentence_records
    from unit.core.test_mapfree import load_real

    spec, model, tok, config = load_real(name, tmp_path_factory, 16)
    kind = model_kind(config, spec)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    bos = decoder_bos(tok, config, spec)
    lines = []
    ewt = sentence_records(read_conllu(EWT_DEV))[:48]
    tokenized, _ = tokenize_records(ewt, tok, kind, 128, "truncate", bos)
    for mode in MODES:
        total, differ, te, tf, err = check_syntax(model, tokenized, kind, ewt, pad, name, mode, batch_size=16)
        lines.append(
            f"{name} Tables 1/3 ({mode}): {total} predictions, {differ} differ (near-ties), exact ties "
            f"{te} eager / {tf} map-free; word maps max |eager - map-free| {err:.1e}"
        )
        assert differ <= max(te, tf) + total // 1000
    docs = gum_docs[:2]
    tokenized, _ = tokenize_records(docs, tok, kind, 512, "truncate", bos)
    total, differ, te, tf = check_coref(model, tokenized, kind, docs, pad, name, "mean")
    lines.append(f"{name} Table 2 (mean): {total} predictions, {differ} differ (near-ties), ties {te} / {tf}")
    assert differ <= max(te, tf) + total // 1000
    with capsys.disabled():
        print("\n" + "\n".join(lines))
