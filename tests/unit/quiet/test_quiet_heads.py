"""Quiet heads (headatlas.quiet): positional share and largest weight on hand-built maps, map-free equal to eager on
the tiny models, a head with zero output (norm 0), constant entropy across sequences (variance 0), a planted
massive activation found at its layer, channel and token, and the join with the detectors (the zero-ablation:
tests/unit/quiet/test_quiet_zero.py)."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from headatlas.core.data import SPECIAL_BOS, SPECIAL_NONE
from headatlas.core.layer_view import feed_layer
from headatlas.core.reduce import fused_reduce
from headatlas.core.reducer import FeedInfo, ReduceBatch
from headatlas.quiet.analysis import (
    QuietSettings,
    head_stats,
    heads_table,
    massive_table,
    natural_inputs,
    summary_table,
    variance_ci,
)
from headatlas.quiet.reducers import ROW_STATS, ActivityReducer, RowMaxReducer

S = {s: i for i, s in enumerate(ROW_STATS)}


def seq_rows(n: int) -> dict:
    special = [SPECIAL_BOS] + [SPECIAL_NONE] * (n - 1)
    return {"word": np.arange(n) - 1, "special": np.array(special), "segment": np.zeros(n, int),
            "piece": np.array([f"t{i}" for i in range(n)], dtype=object)}  # fmt: skip


def reduce_maps(maps: np.ndarray, lengths, causal: bool) -> np.ndarray:
    """The RowMaxReducer's [N, 1, H, 4] on hand-built maps [N, H, n, n] (one layer)."""
    seqs = [seq_rows(k) for k in lengths]
    batch = ReduceBatch.from_rows(np.arange(len(seqs)), seqs, np.arange(len(seqs)), list(lengths))
    r = RowMaxReducer()
    r.start(FeedInfo(len(seqs), 1, maps.shape[1], model_kind="decoder" if causal else "encoder"))
    feed_layer([r], r.info, 0, torch.from_numpy(maps.astype(np.float32)), batch)
    return r.result()["stats"]


def offset_head(n: int, offset: int, causal: bool) -> np.ndarray:
    """Every row on key i + offset where it exists, else on the nearest key the row may see."""
    a = np.zeros((n, n))
    for i in range(n):
        a[i, min(max(i + offset, 0), i if causal else n - 1)] = 1.0
    return a


def uniform_head(n: int, causal: bool) -> np.ndarray:
    mask = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    return mask / mask.sum(1, keepdims=True)


# --- positional heads and the largest weight on hand-built maps ----------------------------------------------------


def test_decoder_head_fixed_on_offset_minus_one_has_positional_share_one():
    n = 6
    maps = np.stack([offset_head(n, -1, True), uniform_head(n, True), offset_head(n, 0, True)])[None]
    s = reduce_maps(maps, [n], causal=True)[0, 0]  # [H, 4]
    assert s[0, S["prev"]] == 1.0  # rows 1..5 all on i - 1 (row 0 has no key at -1: not counted)
    assert np.isnan(s[:, S["next"]]).all()  # under a causal mask no row has a key at +1
    assert s[0, S["max_weight"]] == 1.0 and s[0, S["entropy"]] == pytest.approx(0.0, abs=1e-6)
    # uniform rows: the maximum is tied (except row 0, one key): no offset's maximum; largest weight 1/(i + 1)
    assert s[1, S["prev"]] == 0.0
    assert s[1, S["max_weight"]] == pytest.approx(np.mean(1 / np.arange(1, n + 1)))
    assert s[1, S["entropy"]] == pytest.approx(np.mean(np.log(np.arange(1, n + 1))), abs=1e-6)
    assert s[2, S["prev"]] == 0.0  # the diagonal head


def test_encoder_next_head_and_padding():
    n, short = 5, 3
    long_maps = np.stack([offset_head(n, 1, False), offset_head(n, -1, False)])
    pad = np.zeros((2, n, n))
    pad[:, :short, :short] = np.stack([offset_head(short, 1, False), offset_head(short, -1, False)])
    pad[:, short:, 0] = 1.0  # padded rows: finite, ignored
    s = reduce_maps(np.stack([long_maps, pad]), [n, short], causal=False)
    np.testing.assert_array_equal(s[:, 0, 0, S["next"]], [1.0, 1.0])
    np.testing.assert_array_equal(s[:, 0, 1, S["prev"]], [1.0, 1.0])
    # the +1 head's last row falls back to key n - 1 = i: not at -1; rows 1.. of the -1 head are never at +1
    np.testing.assert_array_equal(s[:, 0, 0, S["prev"]], [0.0, 0.0])
    np.testing.assert_array_equal(s[:, 0, 1, S["next"]], [0.0, 0.0])


def test_head_stats_positional_flag_offset_and_ci():
    rng = np.random.default_rng(0)
    n_seq, L, H = 8, 2, 3
    stats = rng.uniform(0.2, 0.5, (n_seq, L, H, 4))
    stats[:, 0, 1, S["prev"]] = 1.0  # head 1-2: every row's maximum on the previous token
    stats[:, 1, 2, S["next"]] = 0.95
    activity = {"norm": rng.uniform(1, 2, (n_seq, L, H)), "first": np.zeros((n_seq, L), bool)}
    t = head_stats(stats, activity, "m", QuietSettings(bootstrap=50))
    got = t.set_index("label")
    assert got.loc["1-2", "quiet_positional"] == 1.0 and got.loc["1-2", "quiet_positional_offset"] == -1
    assert got.loc["2-3", "quiet_positional_offset"] == 1
    assert set(t.loc[t["quiet_positional_head"], "label"]) == {"1-2", "2-3"}
    assert (t["quiet_prev_ci_low"] <= t["quiet_prev"]).all() and (t["quiet_prev"] <= t["quiet_prev_ci_high"]).all()
    np.testing.assert_allclose(t.groupby("layer")["quiet_norm_rel"].mean(), 1.0)


# --- rigid heads: the entropy variance over sequences -----------------------------------------------------------


def test_constant_entropy_across_sequences_has_variance_zero():
    n = 6
    rigid = uniform_head(n, False)  # ln n in every row of every sequence
    maps = []
    for k in range(4):  # head 1: a different sharpness per sequence
        sharp = np.exp((k + 1) * offset_head(n, -1, False))
        maps.append(np.stack([rigid, sharp / sharp.sum(1, keepdims=True)]))
    s = reduce_maps(np.stack(maps), [n] * 4, causal=False)
    ent = s[:, 0, :, S["entropy"]]  # [N, H]
    np.testing.assert_allclose(ent[:, 0], np.log(n), rtol=1e-6)
    activity = {"norm": np.ones((4, 1, 2)), "first": np.zeros((4, 1), bool)}
    t = head_stats(s, activity, "m", QuietSettings(bootstrap=100))
    assert t.loc[0, "quiet_entropy_var"] == pytest.approx(0.0, abs=1e-10)
    assert t.loc[0, "quiet_entropy_var_ci_high"] == pytest.approx(0.0, abs=1e-10)
    assert t.loc[1, "quiet_entropy_var"] == pytest.approx(np.var(ent[:, 1], ddof=1))
    assert (
        t.loc[1, "quiet_entropy_var_ci_low"] <= t.loc[1, "quiet_entropy_var"] <= t.loc[1, "quiet_entropy_var_ci_high"]
    )


def test_variance_ci_resamples_are_the_variance_of_the_drawn_rows():
    x = np.array([[1.0], [2.0], [4.0]])
    counts = np.array([[3.0, 0, 0], [1, 1, 1], [0, 2, 1]])
    var, lo, hi = variance_ci(x, counts, level=0.0)  # level 0: both ends are the median resample
    assert var[0] == pytest.approx(np.var(x, ddof=1))
    draws = [np.var([1, 1, 1], ddof=1), np.var([1, 2, 4], ddof=1), np.var([2, 2, 4], ddof=1)]
    assert lo[0] == pytest.approx(np.median(draws)) and hi[0] == pytest.approx(np.median(draws))


# --- map-free == eager, output norms and massive activations on the tiny models ------------------------------


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_mapfree_equals_eager(name, tiny_loaded, records):
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import decoder_bos, model_kind

    spec, model, tokenizer, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, _ = tokenize_records(records, tokenizer, kind, spec.max_length, "truncate", bos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = {}
    for path in ("eager", "mapfree"):
        reducers = [RowMaxReducer(), ActivityReducer(model)]
        out[path] = fused_reduce(model, tokenized, reducers, 3, kind, None, pad, name, "t", path=path)
    a, b = out["eager"][0]["stats"], out["mapfree"][0]["stats"]
    for k, stat in enumerate(ROW_STATS):
        np.testing.assert_allclose(b[..., k], a[..., k], rtol=0, atol=2e-5, equal_nan=True, err_msg=stat)
    np.testing.assert_allclose(out["mapfree"][1]["norm"], out["eager"][1]["norm"], rtol=1e-5)
    assert np.isfinite(a[..., S["prev"]]).all() and np.isnan(a[..., S["next"]]).all() == (kind == "decoder")


def test_head_with_zero_output_has_norm_zero(tiny_loaded, records):
    from headatlas.core.extract import tokenize_records

    spec, model, tokenizer, config = tiny_loaded("bert")
    model = copy.deepcopy(model)
    d = config.hidden_size // config.num_attention_heads
    value = model.encoder.layer[1].attention.self.value
    with torch.no_grad():  # head 3 of layer 2 reads zero values: its output sum_j A_ij v_j is 0
        value.weight[2 * d : 3 * d] = 0
        value.bias[2 * d : 3 * d] = 0
    tokenized, _ = tokenize_records(records[:5], tokenizer, "encoder", spec.max_length, "truncate", None)
    act = fused_reduce(model, tokenized, [ActivityReducer(model)], 2, "encoder", None, 0, "bert", "t")[0]
    assert (act["norm"][:, 1, 2] == 0).all()
    assert (act["norm"][:, 1, [0, 1, 3]] > 0).all() and (act["norm"][:, 0] > 0).all()


def test_planted_massive_activation_is_found_at_its_layer_channel_and_token(tiny_loaded, records):
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import decoder_bos

    spec, model, tokenizer, config = tiny_loaded("llama")
    model = copy.deepcopy(model)
    channel, value = 5, 500.0

    def plant(module, args, output):  # layer 1's output, token 0 of every sequence: the input of layer 2
        h = output[0] if isinstance(output, tuple) else output
        h[:, 0, channel] = value
        return output

    handle = model.layers[0].register_forward_hook(plant)
    try:
        tokenized, _ = tokenize_records(
            records[:4], tokenizer, "decoder", spec.max_length, "truncate", decoder_bos(tokenizer, config, spec)
        )
        act = fused_reduce(model, tokenized, [ActivityReducer(model)], 2, "decoder", None, 0, "llama", "t")[0]
    finally:
        handle.remove()
    hits = act["hits"]
    planted = hits[(hits["layer"] == 1) & (hits["token"] == 0) & (hits["channel"] == channel)]
    assert len(planted) == 4 and (planted["value"] == value).all()
    assert act["first"][:, 1].all() and not act["first"][:, 0].any()
    assert (act["top"][:, 1] == value).all() and (act["median"][:, 1] * 1000 <= value).all()
    m = massive_table(hits, 4, "llama")
    row = m[(m["layer"] == 1) & (m["channel"] == channel) & (m["token"] == "first")].iloc[0]
    assert row["n_sequences"] == 4 and row["share"] == 1.0 and row["max_abs"] == value


def test_natural_inputs_are_the_detectors_first_records(tiny_loaded, records):
    from headatlas.detectors.sequences import DetectorSettings
    from headatlas.detectors.sequences import natural_inputs as detector_inputs

    spec, model, tokenizer, config = tiny_loaded("bert")
    s = QuietSettings(n_sequences=3, length=16)
    ours, sources = natural_inputs({"c": records}, tokenizer, "encoder", None, s)
    theirs, ids = detector_inputs(records, tokenizer, "encoder", None, DetectorSettings(n_sequences=3, length=16))
    assert [t.ids for t in ours] == [t.ids for t in theirs] and sources == [f"c:{i}" for i in ids]


# --- the join: sinks after a massive activation -----------------------------------------------------------------


def _stats(massive_first) -> pd.DataFrame:
    layer, head = np.divmod(np.arange(4), 2)
    return pd.DataFrame({"model": "m", "layer": layer, "head": head, "n_sequences": 4,
                         "quiet_massive_first": np.repeat(massive_first, 2), "quiet_positional_head": False,
                         "quiet_positional_offset": -1, "quiet_max_weight": 0.5, "quiet_norm_rel": 1.0,
                         "quiet_entropy_var": 0.1})  # fmt: skip


def test_sinks_after_massive_flags():
    stats = _stats([0.0, 1.0])
    det = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "detector": "sink", "input": "natural",
                        "above_threshold": [True, False, True, False]})  # fmt: skip
    h = heads_table(stats, det, None, QuietSettings())
    assert h["quiet_sink_after_massive"].tolist() == [False, pd.NA, True, pd.NA]
    s = summary_table(h, QuietSettings()).iloc[0]
    assert (s["sink_heads"], s["sink_after_massive_heads"], s["massive_layers"]) == (2, 1, 1)
    none = heads_table(stats, None, None, QuietSettings())
    assert none["quiet_sink_after_massive_kind"].str.startswith("skipped").all()


def test_figure_writes_png_and_svg(tmp_path):
    from headatlas.quiet.figures import quiet_figure

    h = heads_table(_stats([0.0, 1.0]), None, None, QuietSettings())
    for c in ("quiet_positional", "quiet_entropy_var"):
        h[c] = 0.5
    layers = pd.DataFrame({"layer": [0, 1], "top_abs": [1.0, 300.0], "median_abs": [0.1, 0.2],
                           "massive_first_share": [0.0, 1.0], "threshold": 100.0})  # fmt: skip
    quiet_figure(h, layers, "m", tmp_path / "q.png", tmp_path / "q.svg")
    assert (tmp_path / "q.png").stat().st_size > 0 and (tmp_path / "q.svg").stat().st_size > 0


def test_every_quiet_column_is_described_with_its_ci_and_kind():
    from headatlas.atlas.analysis import quiet_columns
    from headatlas.atlas.columns import ci_columns, describe, kind_column

    rng = np.random.default_rng(1)
    activity = {"norm": rng.uniform(1, 2, (4, 2, 2)), "first": np.ones((4, 2), bool)}
    stats = head_stats(rng.uniform(0, 1, (4, 2, 2, 4)), activity, "m", QuietSettings(bootstrap=20))
    wide = quiet_columns(heads_table(stats, None, None, QuietSettings()))
    cols = wide.columns
    for c in cols[2:]:
        doc = describe(c)
        assert doc.known and doc.family.startswith("quiet heads"), c
        if pd.api.types.is_numeric_dtype(wide[c]) and not pd.api.types.is_bool_dtype(wide[c]):
            assert doc.unit, c
    for c in ("quiet_prev", "quiet_max_weight", "quiet_entropy", "quiet_entropy_var", "quiet_norm"):
        assert ci_columns(c, cols) == (f"{c}_ci_low", f"{c}_ci_high")
    assert ci_columns("quiet_zero_effect", cols) == ("quiet_zero_effect_ci_low", "quiet_zero_effect_ci_high")
    for c in ("quiet_zero_effect", "quiet_zero_null"):
        assert kind_column(c, cols) == f"{c}_kind"
