"""The circuits analysis: composition of hand-built weights, the random-orientation null, folding on the tiny Llama,
copying and successor scores on toy OV circuits, the retrieval score on hand-built decoding rows, the needle
generator's inputs and the induction check's ablation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headatlas.circuits import analysis as A
from headatlas.circuits import weights as W
from headatlas.circuits.induction import InductionSettings, ablation_tables, induction_scores, pick_heads
from headatlas.circuits.longrange import (
    LongSettings,
    copy_hits,
    decode_run,
    holds_value,
    layer_windows,
    needle_inputs,
    retrieval_bins,
    rouge1_recall,
    step_top,
    top_share,
)
from headatlas.core.figures import head_label


def hand_weights(q, k, v, o, norm="rmsnorm") -> W.HeadWeights:
    """HeadWeights from per-head lists [L][H] of [D, d] / [d, D] arrays."""
    arr = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    return W.HeadWeights(q=arr(q), k=arr(k), v=arr(v), o=arr(o), norm=norm, kv_heads=1, layout="hand")


def unit(i, dim=4):
    e = np.zeros((dim, 1))
    e[i] = 1.0
    return e


def test_composition_identical_is_one_orthogonal_is_zero():
    # layer 0 writes e0 (reads e0); layer 1 head 0 reads e0 everywhere (Q, K, V: score 1), head 1 reads e1 (0)
    e0, e1 = unit(0), unit(1)
    q = [[e0, e0], [e0, e1]]
    o = [[e0.T, e0.T], [e0.T, e1.T]]
    comp = W.composition(hand_weights(q, q, q, o))
    for mi in range(3):
        assert comp["score"][mi, 0, 2] == pytest.approx(1.0)  # writer 0-0 -> reader 1-0
        assert comp["score"][mi, 0, 3] == pytest.approx(0.0, abs=1e-7)  # writer 0-0 -> reader 1-1
        assert np.isnan(comp["score"][mi, 2, 0])  # no path from a later layer
    assert comp["causal"][:2, 2:].all() and not comp["causal"][2:, :2].any() and not comp["causal"][0, 1]


def reference_scores(hw: W.HeadWeights) -> np.ndarray:
    """TransformerLens' definition on the full D x D matrices, pair by pair."""
    n_layers, n_heads, d_model, _ = hw.shape
    q, k, v = (x.reshape(-1, d_model, x.shape[-1]) for x in (hw.q, hw.k, hw.v))
    o = hw.o.reshape(-1, hw.o.shape[-2], d_model)
    n = len(q)
    out = np.full((3, n, n), np.nan)
    fro = np.linalg.norm
    for a in range(n):
        ov_a = v[a] @ o[a]
        for b in range(n):
            if a // n_heads < b // n_heads:
                for mi, m in enumerate((q[b] @ k[b].T, k[b] @ q[b].T, v[b] @ o[b])):
                    out[mi, a, b] = fro(ov_a @ m) / (fro(ov_a) * fro(m))
    return out


def test_composition_matches_the_definition_on_random_weights():
    rng = np.random.default_rng(0)
    shape = (3, 2, 6, 2)
    hw = hand_weights(rng.normal(size=shape), rng.normal(size=shape), rng.normal(size=shape),
                      rng.normal(size=(3, 2, 2, 6)))  # fmt: skip
    got = W.composition(hw)["score"]
    np.testing.assert_allclose(got, reference_scores(hw), rtol=1e-5, equal_nan=True)


def _random_weights(seed: int, n_layers: int = 5, n_heads: int = 3, d_model: int = 8, d_head: int = 2):
    rng = np.random.default_rng(seed)
    shape = (n_layers, n_heads, d_model, d_head)
    return hand_weights(rng.normal(size=shape), rng.normal(size=shape), rng.normal(size=shape),
                        rng.normal(size=(n_layers, n_heads, d_head, d_model)))  # fmt: skip


def _budget(n_grams: int, d_model: int = 8) -> float:
    """memory_gb that holds exactly ``n_grams`` Gram triangles of ``d_model``."""
    return n_grams * 2 * d_model * (d_model + 1) / 2**30


def _same_scores(got: dict, want: dict, pairs: np.ndarray) -> None:
    """Equal on ``pairs`` to float32 rounding of the Gram products (s^2 = 1/D + z sd to 1e-6)."""
    np.testing.assert_allclose(got["score"][:, pairs], want["score"][:, pairs], rtol=1e-5)
    np.testing.assert_allclose(got["null_sd"][:, pairs], want["null_sd"][:, pairs], rtol=1e-12)
    s2 = lambda c: (c["z"] * c["null_sd"])[:, pairs]  # noqa: E731
    np.testing.assert_allclose(s2(got), s2(want), atol=1e-6)


@pytest.mark.parametrize("n_grams", [2, 3, 5, 13, 15])
def test_composition_in_writer_blocks_equals_one_block(n_grams):
    # 2: one writer and one reader at a time; 3, 5, 13: blocks that cut layers; 15: the 12 writers in one block
    hw = _random_weights(3)
    whole = W.composition(hw)
    blocks = W.composition(hw, memory_gb=_budget(n_grams))
    _same_scores(blocks, whole, whole["causal"])
    np.testing.assert_allclose(blocks["score"], reference_scores(hw), rtol=1e-5, equal_nan=True)
    assert (blocks["scored"] == whole["causal"]).all()


@pytest.mark.parametrize("gap", [1, 2, 4])
def test_max_layer_gap_scores_only_the_near_pairs(gap):
    hw = _random_weights(4)
    whole = W.composition(hw)
    near = W.composition(hw, max_layer_gap=gap, memory_gb=_budget(4))
    layer = np.repeat(np.arange(5), 3)
    apart = layer[None, :] - layer[:, None]
    expect = (apart >= 1) & (apart <= gap)
    assert (near["scored"] == expect).all() and (near["causal"] == whole["causal"]).all()
    for key in ("score", "z", "null_sd"):
        assert np.isnan(near[key][:, ~expect]).all()
    _same_scores(near, whole, expect)
    pairs, summary = A.composition_tables(near, "m", 5, 3, hw.d_eff, A.CircuitSettings())
    assert len(pairs) == expect.sum() == summary["n_pairs"].iloc[0]
    assert ((pairs["reader_layer"] - pairs["writer_layer"]).between(1, gap)).all()
    cols = A.composition_head_columns(near, 5, 3)
    z_in = np.where(expect, near["z"][1], -np.inf).max(0)
    np.testing.assert_allclose(cols["circ_k_in_z"], np.where(np.isfinite(z_in), z_in, np.nan), equal_nan=True)
    back = A.composition_from_pairs(pairs, 5, 3)
    assert (back["scored"] == expect).all()


def test_composition_settings_read_the_sub_section():
    s = A.CircuitSettings.from_config({"composition": {"max_layer_gap": 3, "memory_gb": 0.5}})
    assert (s.composition.max_layer_gap, s.composition.memory_gb) == (3, 0.5)
    assert A.CircuitSettings().composition.max_layer_gap is None


def test_induction_ranks_only_the_scored_writers():
    # reader 3-0 of 4 x 2 heads; gap 2: writers of layers 1 and 2 scored (z 1 2 / 3 4), layer 0 absent from the table
    comp = W.composition(_random_weights(6, n_layers=4, n_heads=2), max_layer_gap=2)
    pairs, _ = A.composition_tables(comp, "m", 4, 2, 8, A.CircuitSettings())
    pairs.loc[pairs["reader"] == head_label(3, 0), "comp_k_z"] = [1.0, 2.0, 3.0, 4.0]
    back = A.composition_from_pairs(pairs, 4, 2)
    result = {"prev": [(1, 1), (0, 0)], "induction": [(3, 0)], "intact": np.ones((3, 1)),
              "ablated": np.zeros((3, 1)), "random": np.zeros((0, 3, 1))}  # fmt: skip
    prev_scores = np.array([[9.0, 9.0], [1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    _, rows = ablation_tables(result, "m", InductionSettings(bootstrap=10), back, prev_scores, 2)
    row = rows.iloc[0]
    assert row["k_comp_prev_percentile"] == pytest.approx(0.25)  # 1-1 (z 2) above 1 of the 4 scored writers
    assert row["k_comp_top"] == f"{head_label(2, 1)} {head_label(2, 0)}" and row["k_comp_top_overlap"] == 0
    assert row["k_comp_prev_spearman"] == pytest.approx(1.0)  # over the scored writers only


def test_random_orientation_null_has_the_haar_mean_and_variance():
    from scipy.stats import ortho_group

    rng = np.random.default_rng(1)
    dim = 6
    hw = hand_weights(rng.normal(size=(2, 1, dim, 2)), rng.normal(size=(2, 1, dim, 2)),
                      rng.normal(size=(2, 1, dim, 2)), rng.normal(size=(2, 1, 2, dim)))  # fmt: skip
    comp = W.composition(hw)
    ov_a = hw.v[0, 0] @ hw.o[0, 0]
    qk_b = hw.q[1, 0] @ hw.k[1, 0].T
    us = ortho_group.rvs(dim, size=20000, random_state=2)
    s2 = np.linalg.norm(ov_a @ us @ qk_b, axis=(1, 2)) ** 2 / (np.linalg.norm(ov_a) * np.linalg.norm(qk_b)) ** 2
    assert s2.mean() == pytest.approx(1 / dim, rel=0.02)
    assert s2.std() == pytest.approx(comp["null_sd"][0, 0, 1], rel=0.05)


def test_folding_reproduces_the_tiny_llama_projections(tiny_loaded):
    _, model, _, config = tiny_loaded("llama")
    hw = W.head_weights(model)
    layer = model.layers[1]
    with torch.no_grad():
        layer.input_layernorm.weight.copy_(torch.linspace(0.5, 1.5, config.hidden_size))
    try:
        hw = W.head_weights(model)
        x = torch.randn(5, config.hidden_size)
        with torch.no_grad():
            h = layer.input_layernorm(x)
            q, k = layer.self_attn.q_proj(h), layer.self_attn.k_proj(h)
        xn = (x / x.pow(2).mean(-1, keepdim=True).add(config.rms_norm_eps).sqrt()).double().numpy()
        d = config.hidden_size // config.num_attention_heads
        for head in range(config.num_attention_heads):
            np.testing.assert_allclose(xn @ hw.q[1, head], q[:, head * d : (head + 1) * d].numpy(), atol=1e-5)
            g = head // (config.num_attention_heads // config.num_key_value_heads)  # grouped keys
            np.testing.assert_allclose(xn @ hw.k[1, head], k[:, g * d : (g + 1) * d].numpy(), atol=1e-5)
    finally:
        with torch.no_grad():
            layer.input_layernorm.weight.fill_(1.0)
    assert hw.norm == "rmsnorm" and hw.d_eff == config.hidden_size


def test_layernorm_models_centre_their_weights(tiny_loaded):
    _, model, _, _ = tiny_loaded("bert")
    hw = W.head_weights(model)
    assert hw.norm == "layernorm" and hw.d_eff == model.config.hidden_size - 1
    np.testing.assert_allclose(hw.q.sum(2), 0.0, atol=1e-9)
    np.testing.assert_allclose(hw.o.sum(3), 0.0, atol=1e-9)


def test_copying_on_a_toy_ov_that_copies_exactly():
    dim, n = 8, 8
    x = np.eye(n, dim)  # orthonormal embeddings, unembedding the same
    ident = np.eye(dim)[None, None]  # OV = I (d = D): copies; OV = -I: suppresses
    hw = hand_weights(np.ones((1, 2, dim, dim)), np.ones((1, 2, dim, dim)), np.concatenate([ident, ident], 1),
                      np.concatenate([ident, -ident], 1))  # fmt: skip
    logits = W.ov_logits(hw, x, x)
    copy, neg = W.copying(logits, k=1)
    assert copy[0].all() and not neg[0].any()
    assert neg[1].all() and not copy[1].any()


def test_successor_hits_on_hand_built_logits():
    logits = np.zeros((1, 3, 3))
    logits[0, 0, 1] = logits[0, 1, 2] = 1.0  # item 0 -> 1, item 1 -> 2 rank first
    logits[0, 2, 0] = 1.0  # item 2 has no successor (not counted)
    hits = W.successor_hits(logits, np.array([1, 2, -1]))
    assert hits.tolist() == [[True, True]]
    hits = W.successor_hits(logits, np.array([2, 0, -1]))
    assert hits.tolist() == [[False, False]]


def test_successor_items_use_single_tokens(bpe_tokenizer):
    items = W.successor_items(bpe_tokenizer)
    assert items
    for name, ids, succ in items:
        assert len(ids) == len(succ) >= 3 and len(set(ids)) == len(ids)
        assert all(j == -1 or 0 <= j < len(ids) for j in succ)
        assert (succ[-1] == 0) if name in W.CYCLIC and len(ids) == len(W.SUCCESSOR_TASKS[name]) else True
        assert [bpe_tokenizer.decode([t]).strip() for t in ids][0] in W.SUCCESSOR_TASKS[name]


def test_share_columns_test_against_chance():
    hits = np.zeros((2, 100), dtype=bool)
    hits[0, :50] = True  # head 0 copies half the tokens; head 1 none
    cols = A._share_columns(hits, 0.05, "copying", A.CircuitSettings(bootstrap=50), 1)
    assert cols["circ_copying"].tolist() == [0.5, 0.0]
    assert cols["circ_copying_sig"].tolist() == [True, False]
    assert cols["circ_copying_ci_low"][0] < 0.5 < cols["circ_copying_ci_high"][0]


def test_retrieval_score_on_hand_built_decode_rows():
    ids = np.array([5, 6, 7, 8, 9, 7])
    top = np.array([[2, 3], [5, 0]])  # [L, H] top-1 keys of one step
    hits = copy_hits(top, generated=7, ids=ids, start=1, end=4)  # needle = positions 1..3
    assert hits.tolist() == [[True, False], [False, False]]  # 3 is in the needle but holds 8; 5 holds 7, outside
    assert rouge1_recall("The magic number is 42.", "the number 42") == pytest.approx(3 / 5)
    assert rouge1_recall("a a b", "a") == pytest.approx(1 / 3)
    needle = "The special magic number for the cup is 90076."
    assert holds_value(needle, "90076") and holds_value(needle, "It is 90076.")
    assert not holds_value(needle, "190076") and not holds_value(needle, "9007")
    assert retrieval_bins(np.array([0.0, 0.0, 0.05, 0.3, 0.9, np.nan])).tolist() == [0.4, 0.2, 0.2, 0.2]
    assert top_share(np.array([0.1, 0.9, 0.5, 0.2]), 0.5).tolist() == [False, True, True, False]


def test_no_answered_run_gives_no_score_not_zeros():
    runs = [{"run": 0, "length": 64, "depth": 0.5, "answered": False}]
    t = A.long_tables(runs, np.zeros((1, 2, 2)), {}, None, "m", 2, 2, A.CircuitSettings(bootstrap=10))
    assert t["heads"]["circ_retrieval"].isna().all() and "no answered needle run" in t["note"]
    assert (t["heads"]["circ_retrieval_runs"] == 0).all() and t["bins"].iloc[0][["0", "(0.5,1]"]].isna().all()


def haystack(tokenizer):
    text = " ".join(f"Sentence number {w} is here." for w in "one two three four five six seven eight".split() * 8)
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_needle_generator_inputs(bpe_tokenizer):
    tok = bpe_tokenizer
    hay = haystack(tok)
    s = LongSettings(lengths=(160, 200), depths=(0.0, 0.5, 1.0), needles=2, seed=3)
    items = needle_inputs(tok, hay, s, bos=0, max_positions=256)
    assert len(items) == 2 * 3 * 2
    for it in items:
        assert len(it.ids) == it.length and it.ids[0] == 0
        assert tok.decode(it.ids[it.start : it.end]).strip() == it.needle
        before = tok.decode(it.ids[1 : it.start]).rstrip()
        assert it.start == 1 or before.endswith(".")  # the needle follows a sentence end
        assert tok.decode(it.ids[it.end :]).rstrip().endswith("Answer:")
        assert it.meta["question"].rstrip("?").split()[-1] in it.needle
    assert items[0].start == 1 and items[2].start > items[0].start  # depth 0 first, deeper later
    again = needle_inputs(tok, hay, s, bos=0, max_positions=256)
    assert [i.ids for i in again] == [i.ids for i in items]  # seeded
    with pytest.raises(ValueError, match="positions"):
        needle_inputs(tok, hay, LongSettings(lengths=(512,)), bos=0, max_positions=256)


def test_chat_frame_wraps_the_prompt(bpe_tokenizer):
    tok = bpe_tokenizer
    hay = haystack(tok)
    frame = ([11, 12], [13])
    it = needle_inputs(tok, hay, LongSettings(lengths=(160,), depths=(0.5,), needles=1), 0, 256, frame)[0]
    assert it.ids[:2] == [11, 12] and it.ids[-1] == 13 and len(it.ids) == 160


def test_decode_run_reads_one_row_per_step(tiny_models, bpe_tokenizer):
    from transformers import LlamaForCausalLM

    lm = LlamaForCausalLM.from_pretrained(tiny_models["llama"], attn_implementation="eager").eval()
    it = needle_inputs(bpe_tokenizer, haystack(bpe_tokenizer), LongSettings(lengths=(160,), depths=(0.5,), needles=1),
                       0, 256)[0]  # fmt: skip
    r = decode_run(lm, bpe_tokenizer, it, max_new_tokens=4)
    assert r["score"].shape == (2, 4) and 1 <= len(r["generated"]) <= 4
    assert ((r["score"] >= 0) & (r["score"] <= len(r["generated"]) / (it.end - it.start))).all()


def detectors_table(rows):
    return pd.DataFrame([{"layer": a, "head": b, "detector": d, "mean": m, "significant": s, "main": True}
                         for a, b, d, m, s in rows])  # fmt: skip


def test_pick_heads_takes_significant_heads_below_the_induction_heads():
    t = detectors_table([(2, 0, "induction", 0.8, True), (3, 1, "induction", 0.9, False), (1, 1, "prev", 0.7, True),
                         (2, 1, "prev", 0.9, True), (0, 0, "prev", 0.5, True), (1, 0, "prev", 0.99, False)])  # fmt: skip
    prev, ind = pick_heads(t, 2, 3)
    assert ind == [(2, 0)] and prev == [(1, 1), (0, 0)]
    assert pick_heads(detectors_table([(1, 1, "prev", 0.7, True)]), 2, 2) == ([], [])


def test_ablating_the_last_layer_leaves_every_induction_score(tiny_loaded, bpe_tokenizer):
    from headatlas.ablation.patch import HeadPatch
    from headatlas.core.extract import head_output_modules
    from headatlas.detectors.sequences import DetectorSettings, random_inputs

    spec, model, tok, config = tiny_loaded("llama")
    seqs, kinds = random_inputs(tok, "decoder", 0, DetectorSettings(n_sequences=3, length=16, repeat_length=6), 256)
    rep = [t for t, k in zip(seqs, kinds) if k == "repeated"]
    patch = HeadPatch(head_output_modules(model, 2), 4)
    intact = induction_scores(model, rep, 4, "decoder", 0, "llama")
    last = np.zeros((2, 4), bool)
    last[1] = True
    zeros = np.zeros((2, 4, config.hidden_size // 4))
    same = induction_scores(model, rep, 4, "decoder", 0, "llama", patch, last, zeros)
    np.testing.assert_array_equal(same, intact)  # a head's output reaches no attention of its own or earlier layers
    first = ~last
    changed = induction_scores(model, rep, 4, "decoder", 0, "llama", patch, first, zeros)
    assert np.array_equal(changed[:, 0], intact[:, 0]) and not np.allclose(changed[:, 1], intact[:, 1])


def test_induction_settings_from_config():
    s = InductionSettings.pick({"n_prev": 2, "activate": True, "random_sets": 0})
    assert (s.n_prev, s.random_sets) == (2, 0)


def test_atlas_reads_the_circuit_columns():
    from headatlas.atlas.analysis import build_atlas

    heads = pd.DataFrame({"model": "m", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "label": ["1-1", "1-2", "2-1", "2-2"],
                          "circ_copying": [0.9, 0.0, 0.1, 0.2], "circ_copying_p": [0.0, 1.0, 0.5, 0.4],
                          "circ_copying_chance": 0.01, "circ_k_in_from": ["", "", "1-1", "1-2"]})  # fmt: skip
    atlas = build_atlas("m", 2, 2, {"circuits": heads})
    assert atlas["circ_copying"].tolist() == [0.9, 0.0, 0.1, 0.2]
    assert "circ_copying_p" not in atlas and "circ_copying_chance" not in atlas and "circ_k_in_from" in atlas


def test_long_inputs_beyond_the_models_positions_are_left_out_with_a_note():
    """A model with fewer positions than a configured needle or block length (GPT-2's 1024, a tiny model's 256)
    runs the lengths that fit and names the rest, instead of failing the analysis."""
    s = LongSettings(lengths=(128, 232, 233, 1024), block_lengths=(64, 127, 128), max_new_tokens=24)
    fit, note = A.fitting_lengths(s, 256)
    assert fit.lengths == (128, 232) and fit.block_lengths == (64, 127)
    assert (
        note == "long inputs: needle lengths [233, 1024] and block lengths [128] skipped: the model has 256 positions"
    )
    same, none = A.fitting_lengths(LongSettings(lengths=(128,), block_lengths=(64,)), 256)
    assert same == LongSettings(lengths=(128,), block_lengths=(64,)) and none == ""


def test_step_top_maps_a_sliding_windows_row_to_positions():
    """A sliding-window layer's cache holds only its last keys: index i of its row is position n - k + i."""
    window = np.array([[0.1, 0.7, 0.1, 0.1], [0.0, 0.0, 0.2, 0.8]])  # [H, 4]: the last 4 of 10 keys
    full = np.array([[0.5] + [0.5 / 9] * 9, [0.0] * 9 + [1.0]])  # [H, 10]
    assert step_top([window, full], 10).tolist() == [[7, 9], [0, 9]]


def sliding_decode(window: int, start: int, end: int, n: int, steps: int):
    """Hand-built decoding rows of a two-layer, two-head model whose layer 1 attends within ``window`` keys and
    layer 2 globally. At step j (k keys) the sliding heads read needle token j where their window holds it (row
    index start + j - (k - window)), else row index start + j (read as a position of the prompt, needle token j);
    global head 1 reads the BOS, global head 2 needle token j. The prompt is ``n`` tokens, the needle [start, end) holds tokens 100, 101, ...; step
    j generates 100 + j."""
    ids = np.arange(n) + 1000
    ids[start:end] = 100 + np.arange(end - start)
    seq, hits = ids.copy(), np.zeros((2, 2))
    for j in range(steps):
        k = len(seq)
        slide = np.zeros((2, min(window, k)))
        visible = start + j >= k - window
        slide[:, start + j - (k - window) if visible else start + j] = 1.0
        glob = np.zeros((2, k))
        glob[0, 0] = 1.0
        glob[1, start + j] = 1.0  # the needle's token j
        gen = 100 + j
        hits += copy_hits(step_top([slide, glob], k), gen, seq, start, end)
        seq = np.append(seq, gen)
    return hits / (end - start)


def test_window_check_on_hand_built_decode_rows():
    """A needle beyond the window: the sliding layer's heads score 0 (read as positions of the prompt, their row
    indices would be the needle's tokens: 1 each); the global head that reads the needle scores 1. A needle inside
    the window: the sliding heads copy it too, and the check passes."""
    far = sliding_decode(window=8, start=1, end=4, n=40, steps=3)
    assert far.tolist() == [[0.0, 0.0], [0.0, 1.0]]
    near = sliding_decode(window=8, start=34, end=37, n=40, steps=3)
    assert near.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    runs = pd.DataFrame({"run": [0, 1], "length": 40, "depth": [0.0, 0.9], "needle_start": [1, 34],
                         "needle_end": [4, 37], "answered": True})  # fmt: skip
    table = A.window_check(runs, np.stack([far, near]), np.array([8, 0]), "m")
    assert table["distance"].tolist() == [36, 3] and table["beyond_window"].tolist() == [True, False]
    assert table["window"].tolist() == [8, 8] and table["sliding_layers"].tolist() == ["1", "1"]
    assert table["global_layers"].tolist() == ["2", "2"] and table["max_global"].tolist() == [1.0, 1.0]
    assert table["max_sliding"].tolist() == [0.0, 1.0] and table["ok"].all()
    A.assert_windows(table)
    wrong = np.stack([far, near])
    wrong[0, 0, 1] = 1 / 3  # a sliding head copying a needle 36 tokens back through an 8-key window
    bad = A.window_check(runs, wrong, np.array([8, 0]), "m")
    assert bad["ok"].tolist() == [False, True]
    with pytest.raises(RuntimeError, match="run 0 \\(needle 36 tokens back, window 8"):
        A.assert_windows(bad)
    assert A.window_check(runs, wrong, np.array([8, 0]), "m")["ok"].tolist() == [False, True]
    skip = A.window_check(runs, wrong, np.array([0, 0]), "m")
    assert skip[["status", "reason"]].values.tolist() == [["skipped", "no sliding-window layers"]]


def tiny_gemma3(vocab_size: int, window: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=window,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           max_position_embeddings=512, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    return Gemma3ForCausalLM(cfg).eval()


def test_layer_windows_name_the_sliding_layers():
    from types import SimpleNamespace

    from transformers import LlamaConfig

    assert layer_windows(tiny_gemma3(64, 16).config).tolist() == [16, 16, 0]
    assert layer_windows(LlamaConfig(num_hidden_layers=2)).tolist() == [0, 0]
    assert layer_windows(SimpleNamespace(num_hidden_layers=2, sliding_window=4096)).tolist() == [4096, 4096]


def test_decode_run_on_a_sliding_window_cache(bpe_tokenizer):
    """Gemma-3's cache keeps a sliding layer's last keys only (rows of ``window`` keys beside the global layer's
    full rows): decoding reads them as positions, and a needle beyond the window scores 0 on sliding heads."""
    lm = tiny_gemma3(len(bpe_tokenizer), 16)
    it = needle_inputs(bpe_tokenizer, haystack(bpe_tokenizer), LongSettings(lengths=(160,), depths=(0.1,), needles=1),
                       0, 512)[0]  # fmt: skip
    r = decode_run(lm, bpe_tokenizer, it, max_new_tokens=4)
    assert r["score"].shape == (3, 2) and it.length - it.end >= 16
    runs = pd.DataFrame([{"run": 0, "length": it.length, "depth": 0.1, "needle_start": it.start,
                          "needle_end": it.end, "answered": False}])  # fmt: skip
    table = A.window_check(runs, r["score"][None], layer_windows(lm.config), "tiny")
    assert table["beyond_window"].all() and table["ok"].all() and (r["score"][:2] == 0).all()


def test_agreement_includes_the_ablation_effect_or_says_not_run():
    heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "circ_retrieval": [0.4, 0.3, 0.2, 0.1],
                          "circ_echo_long": [0.1, 0.2, 0.3, 0.4], "circ_note": ""})  # fmt: skip
    s = A.CircuitSettings(bootstrap=20, agreement_top_k=2)
    none = A.agreement(heads, None, None, "m", s)
    assert none[["score_a", "score_b", "status"]].values.tolist() == [
        ["retrieval", "echo_long", "ok"],
        ["induction_long", "", "skipped: long inputs not run"],
        ["induction_short", "", "not run: analysis.detectors does not cover the model"],
        ["sink", "", "not run: analysis.detectors does not cover the model"],
        ["ablation", "", "not run: analysis.ablation does not cover the model"],
    ]
    assert none["spearman"].iloc[0] == pytest.approx(-1.0) and none["top_k_overlap"].iloc[0] == 0
    abl = pd.DataFrame({"task": "lm", "status": "ok", "reason": "", "metric": "loss", "layer": [0, 0, 1, 1],
                        "head": [0, 1, 0, 1], "effect": [0.9, np.nan, 0.5, 0.1]})  # fmt: skip
    t = A.agreement(heads, None, abl, "m", s).set_index(["score_a", "score_b"])
    row = t.loc[("retrieval", "ablation_lm_loss")]
    assert row["status"] == "ok" and row["n_heads"] == 3 and row["spearman"] == pytest.approx(1.0)
    assert row["top_k_overlap"] == 2 and ("ablation", "") not in t.index
    skipped = abl.assign(status="skipped", reason="no LM head", effect=np.nan)
    t = A.agreement(heads, None, skipped, "m", s).set_index("score_a")
    assert t.loc["ablation", "status"] == "skipped: no LM head"
