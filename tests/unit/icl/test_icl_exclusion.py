"""The exclusion test (Yin & Steinhardt 2025): the two head sets with their overlap removed, matched random sets, joint
mean-ablation (= a plain hook ablating the same heads), the early / late token-loss difference on a hand-built model
whose answer is exact, and the table end to end on a tiny random Llama."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.icl.analysis import IclSettings
from headatlas.icl.exclusion import (
    COLUMNS,
    ExclusionSettings,
    TokenLossEvaluation,
    ablated_runs,
    exclusion_sets,
    exclusion_table,
    random_draws,
    skip_reason,
    skipped_table,
)

# --- the head sets ---------------------------------------------------------------------------------------


def test_sets_remove_the_other_kinds_top_heads_and_keep_their_size():
    fv = np.full(50, np.nan)  # 50 heads, share 0.04: n = 2
    fv[[5, 7, 9, 11, 13]] = [0.9, 0.8, 0.7, 0.6, 0.6]
    ind = np.zeros(50)
    ind[[7, 11, 3, 5]] = [1.0, 0.9, 0.5, 0.4]
    s = exclusion_sets(fv, ind, 0.04)
    assert s["n"] == 2
    assert list(s["fv"]["top"]) == [5, 7] and list(s["induction"]["top"]) == [7, 11]
    assert list(s["overlap"]) == [7]  # in both top lists: in neither set
    assert list(s["fv"]["set"]) == [5, 9]  # 7 and 11 are top induction heads: skipped, the set stays at n
    assert list(s["induction"]["set"]) == [11, 3]  # 7 and 5 are top FV heads
    # ties go to the lower flat index; heads without a value are never picked
    tie = exclusion_sets(np.array([0.1, 0.5, 0.5, np.nan]), np.array([0.0, 0.0, 0.0, 1.0]), 0.5)
    assert list(tie["fv"]["top"]) == [1, 2] and list(tie["induction"]["top"]) == [3, 0]
    assert list(tie["fv"]["set"]) == [1, 2] and list(tie["induction"]["set"]) == [3, 0]
    assert exclusion_sets(np.arange(10.0), np.arange(10.0), 0.001)["n"] == 1  # at least one head


def test_matched_random_sets_keep_the_layer_counts_and_avoid_both_sets():
    L, H = 6, 8
    rng = np.random.default_rng(0)
    s = exclusion_sets(rng.normal(size=L * H), rng.normal(size=L * H), 0.1)  # n = 5
    draws = random_draws(s, L, H, 20, seed=3)
    banned = set(np.concatenate([s[k][p] for k in ("fv", "induction") for p in ("top", "set")]).tolist())
    for k in ("fv", "induction"):
        want = np.bincount(s[k]["set"] // H, minlength=L)
        assert len(draws[k]) == 20
        for d in draws[k]:
            assert len(set(d.tolist())) == len(d) == s["n"]
            assert np.array_equal(np.bincount(d // H, minlength=L), want)
            assert not banned & set(d.tolist())
        assert len({tuple(d) for d in draws[k]}) > 1  # draws differ
    again = random_draws(s, L, H, 20, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(draws["fv"], again["fv"]))  # seeded


# --- joint mean-ablation and the token-loss difference --------------------------------------------------------


def _tiny(arch: str):
    """A tiny random causal LM (2 layers x 4 heads, vocabulary 40), fresh per call."""
    import torch
    from conftest import tiny_llama_config
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(tiny_llama_config(40, 0, pad_token_id=None))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_layer=2, n_head=4, n_embd=32, n_positions=64))
    return model.eval()


@pytest.fixture(scope="module")
def tiny_llama():
    return _tiny("llama")


def _text_evaluation(model, texts, early, late, batch_size=2, keep=True, shape=(2, 4)):
    import torch

    batches = []
    for i in range(0, len(texts), batch_size):
        x = torch.as_tensor(texts[i : i + batch_size])
        inputs = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        if keep:
            inputs["logits_to_keep"] = torch.tensor([early - 1, late - 1])
        batches.append((inputs, x, np.arange(i, i + len(x))))
    ev = TokenLossEvaluation("lm", model, batches, len(texts), *shape)
    ev.positions = (early, late)
    return ev


def test_joint_mean_ablation_equals_a_plain_hook_on_the_same_heads(tiny_llama):
    """Per text the losses at both tokens with heads 0-1 and 1-3 (0-based) mean-ablated at once, computed with the
    ablation's patch, equal a plain pre-hook on the output projections (means over every token), and the loss
    values equal the cross-entropy of the full logits; both with and without logits_to_keep."""
    import torch
    import torch.nn.functional as F

    from headatlas.core.extract import head_output_modules

    model = tiny_llama
    rng = np.random.default_rng(1)
    texts = [list(rng.integers(1, 40, size=16)) for _ in range(5)]
    o_projs = head_output_modules(model, 2)
    mask = np.zeros((2, 4), bool)
    mask[0, 1] = mask[1, 3] = True
    x = torch.tensor(texts)
    captured = []
    hooks = [m.register_forward_pre_hook(lambda mod, a: captured.append(a[0].detach())) for m in o_projs]
    with torch.no_grad():
        model(input_ids=x, attention_mask=torch.ones_like(x))
    for h in hooks:
        h.remove()
    means = [c.reshape(-1, 4, 8).mean(0) for c in captured]  # per layer [H, d] over every token

    def reference(ablate: bool) -> np.ndarray:
        def hook(module, args, layer):
            z = args[0].clone().reshape(*args[0].shape[:-1], 4, 8)
            for h in np.flatnonzero(mask[layer]):
                z[..., h, :] = means[layer][h]
            return (z.reshape(args[0].shape),) + tuple(args[1:])

        handles = [m.register_forward_pre_hook(lambda mod, a, i=i: hook(mod, a, i)) for i, m in enumerate(o_projs)]
        if not ablate:
            for h in handles:
                h.remove()
        try:
            with torch.no_grad():
                logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
        finally:
            for h in handles:
                h.remove()
        tok = F.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none")  # token t+1 at t
        return (tok[:, 12] - tok[:, 2]).numpy()  # late 13, early 3

    ref_intact, ref_ablated = reference(False), reference(True)
    assert np.abs(ref_ablated - ref_intact).max() > 1e-3  # the ablation moves the losses
    for keep in (True, False):
        ev = _text_evaluation(model, texts, 3, 13, keep=keep)
        intact, abl = ablated_runs(ev, [mask, np.zeros_like(mask)], lambda o: o["late"] - o["early"])
        np.testing.assert_allclose(intact, ref_intact, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(abl[0], ref_ablated, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(abl[1], ref_intact, rtol=1e-4, atol=1e-5)  # an empty set changes nothing


def test_an_fv_evaluation_leaves_the_model_as_it_was(tiny_llama):
    """Building and running an FV evaluation (last logits only) changes nothing on the model: a later forward and
    a token-loss evaluation on it get every position's logits, and any order of evaluations gives the same
    values. The FV evaluation's exact single-head ablation (inputs replicated per head) keeps its
    ``logits_to_keep`` and equals one-at-a-time ablation."""
    import torch

    from headatlas.ablation.patch import replacement
    from headatlas.icl.patching import fv_evaluation

    model = tiny_llama
    rng = np.random.default_rng(2)
    texts = [list(rng.integers(1, 40, size=16)) for _ in range(4)]
    first = ablated_runs(_text_evaluation(model, texts, 3, 13), [], lambda o: o["late"] - o["early"])[0]
    prompts = [list(rng.integers(1, 40, size=9)) for _ in range(3)]
    fv = fv_evaluation(model, prompts, np.array([5, 6, 7]), 3, 2, 4)
    assert all(inputs["logits_to_keep"] == 1 for inputs, _, _ in fv.batches)
    fv.expand = False  # the replicated-inputs path tiles every batch tensor but logits_to_keep
    values = replacement(fv.mean_vectors(), "mean")
    heads = np.arange(8)
    batched = fv.exact(heads, values)["loss"]
    for h in heads:
        one = fv.run(np.isin(np.arange(8), [h]).reshape(2, 4), values)["loss"]
        np.testing.assert_allclose(batched[:, h], one, rtol=1e-5, atol=1e-6)
    x = torch.tensor(texts)
    with torch.no_grad():
        assert model(input_ids=x, attention_mask=torch.ones_like(x)).logits.shape[1] == 16
    again = ablated_runs(_text_evaluation(model, texts, 3, 13), [], lambda o: o["late"] - o["early"])[0]
    np.testing.assert_allclose(again, first, rtol=1e-6)


V = 16  # vocabulary of the hand-built model


def _counter(scale: float = 0.5):
    """A one-layer 'llama'-named model with 2 heads of width 1 reading the running text 0, 1, 2, ... (mod V). Head
    0's output at position t is t; head 1's is 0. The logits at t are ``scale * h0`` on token (x_t + 1) mod V (the
    true next token) and 0 elsewhere, so the loss of token p is log(1 + (V - 1) exp(-scale (p - 1))): the model
    learns in context, and only through head 0."""
    import torch
    from hand_models import one_layer_llama

    def outputs(ids):
        t = torch.arange(ids.shape[1], dtype=torch.float32).expand(ids.shape)
        return torch.stack([t, torch.zeros_like(t)], -1)

    def logits(h, ids):
        return scale * h[..., :1] * torch.nn.functional.one_hot((ids + 1) % V, V).float()

    return one_layer_llama(2, outputs, logits)


def test_token_loss_difference_on_a_model_that_learns_in_context():
    """Intact: loss(late) - loss(early) is the closed form (negative: later tokens are easier). Head 0
    mean-ablated: every position sees the mean position, both losses are equal, the difference is 0 (the
    effect is the whole score); head 1 (zero output, mean zero) changes nothing."""
    model, scale, early, late, n = _counter(), 0.5, 3, 20, 24
    texts = [[(s + t) % V for t in range(n)] for s in range(4)]
    ev = _text_evaluation(model, texts, early, late, keep=False, shape=(1, 2))
    masks = [np.array([[True, False]]), np.array([[False, True]])]
    intact, abl = ablated_runs(ev, masks, lambda o: o["late"] - o["early"])

    def loss(p, h):  # the loss of token p when the logit of the true token at p - 1 is scale * h
        return np.log1p((V - 1) * np.exp(-scale * h))

    want = loss(late, late - 1) - loss(early, early - 1)
    np.testing.assert_allclose(intact, want, rtol=1e-5)
    assert want < -1
    np.testing.assert_allclose(abl[0], 0.0, atol=1e-5)
    np.testing.assert_allclose(abl[1], want, rtol=1e-5)
    ev.positions = (late, early)  # the score is antisymmetric in the two tokens
    np.testing.assert_allclose(ablated_runs(ev, [], lambda o: o["late"] - o["early"])[0], -want, rtol=1e-5)


def test_settings_need_early_below_late_and_positions_scale_to_the_input_length():
    from headatlas.icl.exclusion import token_positions

    with pytest.raises(ValueError, match="analysis.icl.exclusion: early"):
        ExclusionSettings(early=50, late=50)
    s = ExclusionSettings(early=50, late=500)
    assert token_positions(s, None) == token_positions(s, 501) == (50, 500)
    assert token_positions(s, 128) == (13, 127)  # 50 / 500 of 127, rounded
    assert token_positions(ExclusionSettings(early=9, late=10), 4) == (2, 3)  # early stays below late
    with pytest.raises(ValueError, match="2 tokens"):
        token_positions(s, 2)


# --- the table ---------------------------------------------------------------------------------------------------


def _fv_heads(L, H, aie, tasks="t", kind="exact"):
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"model": "m", "layer": layer, "head": head, "aie": aie, "kind": kind, "tasks": tasks})


def _detectors(L, H, score):
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"layer": layer, "head": head, "detector": "induction", "main": True, "mean": score})


def test_skip_reasons_and_skipped_rows():
    heads = _fv_heads(2, 4, np.nan, kind="skipped: an encoder: function-vector heads are measured on next-token")
    assert skip_reason(heads, None).startswith("an encoder")
    ok = _fv_heads(2, 4, np.arange(8.0))
    assert "detectors" in skip_reason(ok, None) and skip_reason(ok, _detectors(2, 4, np.arange(8.0))) == ""
    t = skipped_table("m", "an encoder")
    assert list(t.columns) == COLUMNS and len(t) == 4 and (t["status"] == "skipped: an encoder").all()


class WordTokenizer:
    """One token per space-led word or symbol (ids from a growing table below the tiny model's vocabulary)."""

    def __init__(self):
        self.table: dict[str, int] = {}

    def __call__(self, text, add_special_tokens=False):
        import re

        ids = [self.table.setdefault(p, 1 + len(self.table) % 39) for p in re.findall(r" ?[^ \n:]+|\n\n|\n|:", text)]
        return {"input_ids": ids}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_exclusion_table_end_to_end(arch, tmp_path):
    """On a tiny random Llama and GPT-2 (8 heads, share 0.25: 2 heads per set): one row per set and measure, the
    sets' heads as selected, the random sets' statistics and the rank p-value within their bounds."""
    model = _tiny(arch)
    text = tmp_path / "wiki.raw"
    words = " ".join(f"w{i % 23}" for i in range(400))
    text.write_text(f" = A =\n {words}\n {words}\n = B =\n {words}\n")
    pairs = {"t": [(f"a{i}", f"b{i}") for i in range(30)]}
    L, H = 2, 4
    heads = _fv_heads(L, H, [0.9, 0.1, 0.8, 0.2, 0.3, 0.4, 0.5, 0.0])
    det = _detectors(L, H, [0.9, 0.8, 0.1, 0.2, 0.7, 0.3, 0.0, 0.4])
    icl = IclSettings(n_prompts=4, shots=3, bootstrap=50, min_pairs=2)
    s = ExclusionSettings(share=0.25, random_sets=3, n_texts=3, early=2, late=12)
    t = exclusion_table("m", (model, WordTokenizer(), 0), pairs, heads, det, str(text), icl, s, L, H)
    assert list(t.columns) == COLUMNS and len(t) == 4 and (t["status"] == "ok").all()
    t = t.set_index(["set", "metric"])
    # FV top 2: heads 0, 2; induction top 2: heads 0, 1; head 0 in both
    assert t.loc[("fv", "icl_score"), "heads"] == "1-3 2-3" and t.loc[("fv", "icl_score"), "excluded"] == "1-1"
    assert (
        t.loc[("induction", "icl_score"), "heads"] == "1-2 2-1"
        and t.loc[("induction", "icl_score"), "per_layer"] == "L1:1 L2:1"
    )
    assert (t["n_random_sets"] == 3).all() and (t["n_items"].loc[(slice(None), "icl_score")] == 3).all()
    assert (t["n_items"].loc[(slice(None), "icl_accuracy")] == 4).all()
    assert ((t["rank_p"] >= 0.25) & (t["rank_p"] <= 1) & (t["rank"] >= 1) & (t["rank"] <= 4)).all()
    assert (t["random_min"] <= t["random_mean"]).all() and (t["random_mean"] <= t["random_max"]).all()
    acc = t.xs("icl_accuracy", level="metric")
    np.testing.assert_allclose(acc["effect"], acc["intact"] - acc["ablated"])
    sc = t.xs("icl_score", level="metric")
    assert (sc["ci_low"] <= sc["effect"] + 1e-12).all() and (sc["effect"] <= sc["ci_high"] + 1e-12).all()
