"""Ablations: the head patch, attribution patching, role and random sets, skip reasons, a tiny workflow run."""

from __future__ import annotations

from dataclasses import replace as dataclass_replace

import numpy as np
import pandas as pd
import pytest

from headatlas.ablation.analysis import (
    AblationSettings,
    ablate_heads,
    ablate_roles,
    agreement,
    first_failure,
    layer_check,
    matched_random_sets,
    pruning_orders,
    role_sets,
    specialisation,
)
from headatlas.ablation.patch import HeadPatch, donors, layer_samples, random_heads, replacement

# --- the patch ------------------------------------------------------------------------------


def test_mean_ablation_replaces_exactly_the_heads_slice():
    import torch

    H, d = 3, 2
    proj = torch.nn.Linear(H * d, H * d, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.eye(H * d))  # the output shows the projection's input
    x = torch.arange(2 * 4 * H * d, dtype=torch.float32).reshape(2, 4, H * d)
    values = np.zeros((1, H, d), np.float32)
    values[0, 1] = [-7.0, -8.0]
    mask = np.zeros((1, H), bool)
    mask[0, 1] = True
    with HeadPatch([proj], H) as patch, patch.ablated(mask, torch.as_tensor(values)):
        patch.reset()
        y = proj(x)
    expected = x.clone()
    expected[..., 2:4] = torch.tensor([-7.0, -8.0])  # head 1 = columns [1 * d, 2 * d), at every position
    assert torch.equal(y, expected)
    assert torch.equal(proj(x), x)  # the hooks are gone after the block


def test_shared_projection_is_patched_in_the_right_layer():
    import torch

    H, d = 2, 1
    proj = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.eye(2))
    mask = np.array([[False, False], [True, False]])  # head 2-1 only (layer index 1, head index 0)
    values = np.full((2, H, d), 5.0, np.float32)
    x = torch.ones(1, 1, 2)
    with (
        HeadPatch([proj, proj], H) as patch,
        patch.ablated(mask, torch.as_tensor(values)),
    ):  # one module serves two layers (ALBERT)
        patch.reset()
        first, second = proj(x), proj(x)
    assert first.tolist() == [[[1.0, 1.0]]] and second.tolist() == [[[5.0, 1.0]]]


def test_replacement_modes():
    means = np.ones((1, 2, 3))
    assert (replacement(means, "mean").vectors == 1).all() and (replacement(means, "zero").vectors == 0).all()
    with pytest.raises(ValueError, match="mean, zero, resample"):
        replacement(means, "half")


def test_resample_donors_are_a_seeded_derangement():
    for n in (2, 3, 7, 50):
        d = donors(n, 0)
        assert sorted(d.tolist()) == list(range(n)) and (d != np.arange(n)).all()
    assert (donors(50, 0) == donors(50, 0)).all() and not (donors(50, 0) == donors(50, 1)).all()
    with pytest.raises(ValueError, match="at least 2"):
        donors(1, 0)


def test_layer_samples_seeded_and_distinct():
    s = layer_samples(5, 4, 2, 3)
    assert len(s) == 5 and all(len(set(h)) == 2 and set(h) <= set(range(4)) for h in s)
    assert s == layer_samples(5, 4, 2, 3) and layer_samples(2, 3, 9, 0) == [[0, 1, 2], [0, 1, 2]]


def test_layer_check_sign_flip_and_error_beyond_the_ci():
    est = np.array([0.1, -0.2, 0.05, 0.3])
    exact = np.array([0.1, 0.2, 0.06, 0.3])
    lo, hi = exact - 0.05, exact + 0.05  # half-width 0.05
    lc = layer_check(est, exact, lo, hi, [[0, 1], [0, 1]], 2)
    assert lc["passed"].tolist() == [False, True]
    assert lc["n_sign_flips"].tolist() == [1, 0] and lc["n_outside_ci"].tolist() == [1, 0]
    zero, small = np.zeros(2), np.array([0.01, 0.0])
    lc = layer_check(zero, small, np.array([-0.02, 0.0]), np.array([0.04, 0.0]), [[0, 1]], 2)
    assert lc["passed"].tolist() == [True]  # opposite signs inside a CI that holds 0: no flip
    lc = layer_check(np.array([0.17]), np.array([0.1]), np.array([0.05]), np.array([0.15]), [[0]], 1)
    assert lc["passed"].tolist() == [False] and lc["n_outside_ci"].tolist() == [1]  # 0.07 > half-width 0.05


def test_removable_count_from_the_first_failure():
    harm = np.array([[0.0, 0.05, 0.09, 0.2, 0.05], [0.0, 0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert first_failure(harm, 0.1).tolist() == [2, 0, 4]


# --- sets ----------------------------------------------------------------------------------


def test_matched_random_sets_keep_size_and_layers():
    role = [(0, 0), (0, 1), (2, 3), (3, 0), (3, 1), (3, 2), (3, 3)]  # layer 3 is full: topped up from the role
    sets = matched_random_sets(role, 4, 20, np.random.default_rng(0))
    assert len(sets) == 20
    want = np.bincount([layer for layer, _ in role], minlength=4)
    for s in sets:
        assert len(s) == len(role) == len(set(s))
        np.testing.assert_array_equal(np.bincount([layer for layer, _ in s], minlength=4), want)
        assert not {(0, 0), (0, 1), (2, 3)} & set(s)  # layers with room draw outside the role
    assert len({tuple(s) for s in sets}) > 1
    again = matched_random_sets(role, 4, 20, np.random.default_rng(0))
    assert again == sets  # seeded


def test_random_heads_exclude_and_distinct():
    heads = random_heads(3, 4, 5, np.random.default_rng(1), exclude=[(0, 0), (1, 1)])
    assert len(set(heads)) == 5 and not {(0, 0), (1, 1)} & set(heads)


def test_role_sets_from_the_tsvs():
    pande = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "role": ["local", "local", "local", "block"],
         "significant_fdr": [True, "False", "True", True], "effect": [1.0, 2.0, 3.0, 4.0]}
    )  # fmt: skip
    behaviour = pd.DataFrame({"layer": [0, 1, 1], "head": [1, 0, 1], "label": ["prev", "other", "prev"]})
    syntax = pd.DataFrame(
        {"layer": [0, 1, 1, 0], "head": [0, 1, 0, 1], "relation": ["nsubj", "nsubj", "obj", "All"],
         "direction": ["dep->head"] * 4, "accuracy": [0.2, 0.9, 0.1, 0.99]}
    )  # fmt: skip
    baselines = pd.DataFrame({"relation": ["nsubj", "obj"], "accuracy": [0.5, 0.5]})
    roles = role_sets(pande, behaviour, syntax, baselines, ("local", "block", "syntactic"))
    assert roles == {
        "pande_local": ("pande", [(0, 0), (1, 0)]),
        "pande_block": ("pande", [(1, 1)]),
        "clark_prev": ("clark_behaviour", [(0, 1), (1, 1)]),
        "clark_syntax": ("clark_syntax", [(1, 1)]),  # obj's best head is below its baseline; 'All' is no relation
    }
    spec = specialisation(2, 2, roles, pande)
    assert spec["n_roles"].tolist() == [1, 1, 1, 3]
    orders = pruning_orders(spec, np.array([0.3, np.nan, -0.1, 0.2]), seed=0)
    assert orders["atlas"].tolist() == [0, 1, 2, 3]  # ties on n_roles broken by the Pande effect
    assert orders["ablation"].tolist() == [2, 3, 0, 1]  # least needed first, unknown last
    assert sorted(orders["random"].tolist()) == [0, 1, 2, 3]


def test_agreement_rank_and_overlap():
    a = agreement(np.array([3.0, 2.0, 1.0, 0.0]), np.array([30.0, 10.0, 20.0, 0.0]), 2)
    assert a["spearman"] == pytest.approx(0.8) and a["top_k_overlap"] == 1 and a["max_abs_error"] == 27


# --- tiny models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ablation_models(tmp_path_factory, bert_vocab_file, bpe_tokenizer_object):
    """A tiny Llama with its causal-LM head whose layer-0 head 1 has a zero output projection, and
    a tiny BERT without any head."""
    import torch
    from conftest import tiny_llama_config
    from transformers import BertConfig, BertModel, BertTokenizerFast, LlamaForCausalLM

    root = tmp_path_factory.mktemp("ablation_models")
    bpe = bpe_tokenizer_object
    torch.manual_seed(1)
    llama = LlamaForCausalLM(
        tiny_llama_config(len(bpe), bpe.bos_token_id, max_position_embeddings=128, pad_token_id=None)
    )
    d = llama.config.hidden_size // llama.config.num_attention_heads
    with torch.no_grad():
        llama.model.layers[0].self_attn.o_proj.weight[:, d : 2 * d] = 0
    llama.save_pretrained(root / "llama_lm")
    bpe.save_pretrained(root / "llama_lm")
    wp = BertTokenizerFast(vocab=str(bert_vocab_file), do_lower_case=True)
    torch.manual_seed(0)
    BertModel(
        BertConfig(vocab_size=len(wp), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=128)
    ).save_pretrained(root / "bert_plain")  # fmt: skip
    wp.save_pretrained(root / "bert_plain")
    return root


def _spec(path):
    from headatlas.core.models import ModelSpec

    return ModelSpec.from_config({"name": path.name, "source": {"path": str(path)}, "max_length": 64, "device": "cpu"})


SMALL = AblationSettings(lm_sequences=6, lm_max_tokens=24, random_sets=3, bootstrap=200, pruning_fractions=(0.25, 1.0),
                         prune_grid=4)  # fmt: skip


def _single(ev, values, flat):
    """One-at-a-time exact ablation of one flat head: the reference for the batched one."""
    mask = np.zeros((ev.n_layers, ev.n_heads), bool)
    mask.flat[flat] = True
    return ev.run(mask, values)


@pytest.mark.parametrize("mode", ["mean", "zero", "resample"])
def test_zero_output_projection_head_has_zero_effect(ablation_models, ewt_records, mode):
    from headatlas.ablation.analysis import head_tables
    from headatlas.ablation.tasks import evaluations

    evals, shape = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)
    ev, reason = evals["lm"]
    assert reason is None and shape == (2, 4)
    values = ev.replacement(mode, 0)
    intact = ev.run()
    np.testing.assert_array_equal(_single(ev, values, 1)["loss"], intact["loss"])  # head 0-1 (flat 1): exactly 0
    np.testing.assert_array_equal(ev.exact([1, 6], values)["loss"][:, 0], intact["loss"])  # batched too
    assert not np.array_equal(_single(ev, values, 6)["loss"], intact["loss"])  # another head does matter
    heads, check = head_tables("llama_lm", ev, dataclass_replace(SMALL, mode=mode))
    row = heads[(heads["layer"] == 0) & (heads["head"] == 1)].iloc[0]
    assert row["effect"] == 0 and row["ci_low"] == 0 and row["ci_high"] == 0 and row["estimate"] == 0
    assert (heads["kind"] == "exact").all() and (heads["mode"] == mode).all()  # 8 heads <= exact_max_heads
    allh = check[check["scope"] == "exact heads"].iloc[0]
    assert allh["n_compared"] == 8 and allh["estimator"] == "atp"
    assert (check["scope"] == "layer").sum() == 2


def test_batched_exact_equals_one_at_a_time(ablation_models, ewt_records):
    """Expanded inside the model (layers before a head run once), replicated inputs, one at a time."""
    from headatlas.ablation.tasks import evaluations

    evals, _ = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)
    ev = evals["lm"][0]
    assert ev.expand
    for mode in ("mean", "resample"):
        values = ev.replacement(mode, 0)
        flat = list(range(8))
        one = np.stack([_single(ev, values, f)["loss"] for f in flat], 1)
        for max_rows in (10**6, 1):  # every head in one pass; one head per pass
            np.testing.assert_allclose(ev.exact(flat, values, max_rows)["loss"], one, rtol=1e-5, atol=1e-5)
        ev.expand = False
        np.testing.assert_allclose(ev.exact(flat[::-1], values)["loss"], one[:, ::-1], rtol=1e-5, atol=1e-5)
        ev.expand = True


@pytest.mark.parametrize("model", ["llama_lm", "bert_classifier"])
def test_layer_path_ig_expanded_equals_replicated_and_adds_up_per_layer(model, ablation_models, ewt_records,
                                                                       bert_vocab_file):  # fmt: skip
    """Integrated gradients along each layer's path on a tiny Llama and a padded BERT classifier: the
    blocks built inside the model give the estimates of replicated inputs, and a layer's estimates
    add up to the exact effect of ablating the whole layer (completeness, 32 steps)."""
    from headatlas.ablation.tasks import evaluations

    if model == "llama_lm":
        ev = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)[0]["lm"][0]
    else:
        ev = _padded_classifier(bert_vocab_file)
    L, H = ev.n_layers, ev.n_heads
    for mode in ("mean", "resample"):
        values = ev.replacement(mode, 0)
        ev.expand = True
        got = ev.estimate(values, "ig", 2, max_rows=10**6)
        assert ev.expand  # no fallback
        ev.expand = False
        np.testing.assert_allclose(ev.estimate(values, "ig", 2, max_rows=1), got, rtol=1e-4, atol=1e-6)
    ev.expand = True
    values = ev.replacement("mean", 0)
    fine = ev.estimate(values, "ig", 32)
    intact = ev.run()["loss"]
    for layer in range(L):
        mask = np.zeros((L, H), bool)
        mask[layer] = True
        whole = ev.run(mask, values)["loss"] - intact
        np.testing.assert_allclose(fine[:, layer * H : (layer + 1) * H].sum(1), whole, atol=1e-2 * np.abs(whole).max())


def _padded_classifier(bert_vocab_file, expect_expand=True):
    """A BERT classifier with padded batches (the attention mask is tiled to the expanded batch)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from headatlas.ablation.tasks import Evaluation

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=len(BertTokenizerFast(vocab=str(bert_vocab_file))), hidden_size=32,
                   num_hidden_layers=3, num_attention_heads=4, intermediate_size=37, num_labels=2,
                   initializer_range=0.5)
    ).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    batches = []
    for pos, n in ((np.array([0, 1, 2]), 9), (np.array([3, 4]), 5)):
        ids = torch.randint(5, 60, (len(pos), n), generator=gen)
        mask = torch.ones_like(ids)
        mask[0, n // 2 :] = 0  # padding
        batches.append(({"input_ids": ids, "attention_mask": mask}, torch.tensor([0, 1, 0][: len(pos)]), pos))
    ev = Evaluation("classification", model, batches, 5, 3, 4)
    values = ev.replacement("mean", 0)
    flat = [0, 3, 5, 6, 11]
    got = ev.exact(flat, values, 40)
    ref = [_single(ev, values, f) for f in flat]
    np.testing.assert_allclose(got["loss"], np.stack([r["loss"] for r in ref], 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["correct"], np.stack([r["correct"] for r in ref], 1))
    assert ev.expand == expect_expand  # the expansion worked on BERT (no fallback)
    return ev


def test_batched_exact_on_a_padded_classifier(bert_vocab_file):
    _padded_classifier(bert_vocab_file)


def test_a_wrong_expansion_falls_back_to_replicated_inputs(bert_vocab_file, monkeypatch, caplog):
    """Masks tiled in the wrong order give the right shape but wrong losses: the first expanded
    pass is checked against replicated inputs, and the evaluation falls back to them."""
    import headatlas.ablation.patch as patch_module

    tile = patch_module._tile
    monkeypatch.setattr(patch_module, "_tile", lambda t, blocks, rows: _flip(tile(t, blocks, rows)))
    _padded_classifier(bert_vocab_file, expect_expand=False)
    assert "batch expansion inside the model failed" in caplog.text


def _flip(t):
    import torch

    return t.flip(0) if torch.is_tensor(t) and t.ndim >= 2 else t


# --- toys for the estimators -----------------------------------------------------------------


class _Block:
    pass


def _toy(kind: str, n_layers: int = 2, n_heads: int = 3, d: int = 2, seed: int = 0, saturated: int = 0):
    """A 'llama'-named toy: per layer z = W h (per head), h <- h + o_proj(z); logits = h . r. With the
    metric the logits' mean, the linear toy is linear in every z. ``saturating``: layer ``saturated``
    has W and o_proj the identity, positive embeddings and h <- h + 4 tanh(8 o_proj(z)): saturated at the
    intact model (nearly flat gradient) but far from it when a head is set to zero. ``parallel``: linear,
    every layer reads the embeddings (z = W e), so a head acts on the logits directly only."""
    from types import SimpleNamespace

    import torch

    g = torch.Generator().manual_seed(seed)
    D = n_heads * d

    class Layer(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.o_proj = torch.nn.Linear(D, D, bias=False)
            self.w = torch.nn.Linear(D, D, bias=False)
            self.i = i
            self.saturating = kind == "saturating" and i == saturated
            with torch.no_grad():
                self.w.weight.copy_(torch.eye(D) if self.saturating else torch.randn(D, D, generator=g) * 0.5)
                o = torch.eye(D) if self.saturating else torch.randn(D, D, generator=g) * 0.5
                self.self_attn.o_proj.weight.copy_(o)

        def forward(self, h, e):
            out = self.self_attn.o_proj(self.w(e if kind == "parallel" else h))
            return h + (4 * torch.tanh(8 * out) if self.saturating else out)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(model_type="llama")
            self.emb = torch.nn.Embedding(20, D)
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer(i) for i in range(n_layers)])
            self.r = torch.nn.Linear(D, 1, bias=False)
            with torch.no_grad():
                e = torch.randn(20, D, generator=g)
                self.emb.weight.copy_(0.5 + e.abs() if kind == "saturating" else e)
                self.r.weight.copy_(torch.randn(1, D, generator=g))

        def forward(self, input_ids, attention_mask):
            h = e = self.emb(input_ids)
            for layer in self.model.layers:
                h = layer(h, e)
            return SimpleNamespace(logits=self.r(h))

    return Toy()


def _toy_eval(model, n_layers=2, n_heads=3, n_seq=8, n=5):
    import torch

    from headatlas.ablation.tasks import Evaluation

    class Linear(Evaluation):
        def _metrics(self, out, targets):  # linear in the logits
            return out.logits[..., 0].mean(1), None

    ids = torch.randint(0, 20, (n_seq, n), generator=torch.Generator().manual_seed(3))
    half = n_seq // 2
    batches = [({"input_ids": ids[a:b], "attention_mask": torch.ones(b - a, n, dtype=torch.long)}, None,
                np.arange(a, b)) for a, b in ((0, half), (half, n_seq))]  # fmt: skip
    return Linear("lm", model, batches, n_seq, n_layers, n_heads)


@pytest.mark.parametrize("method", ["atp", "ig"])
@pytest.mark.parametrize("mode", ["mean", "zero", "resample"])
def test_estimate_equals_exact_on_a_linear_toy(method, mode):
    ev = _toy_eval(_toy("linear"))
    values = ev.replacement(mode, 0)
    est = ev.estimate(values, method, 3)
    exact = ev.exact(range(6), values)["loss"] - ev.run()["loss"][:, None]
    np.testing.assert_allclose(est, exact, rtol=1e-4, atol=1e-5)  # per sequence and head


@pytest.mark.parametrize("mode", ["mean", "zero", "resample"])
def test_atpstar_equals_exact_on_a_linear_toy(mode):
    """GradDrop: on a linear toy whose heads act on the logits directly, every dropped layer but the
    head's own gives plain AtP, so AtP* is exact; with paths through later layers (the residual toy)
    the last layer's heads stay exact and an earlier head keeps only its direct effect."""
    ev = _toy_eval(_toy("parallel", n_layers=3), n_layers=3)
    values = ev.replacement(mode, 0)
    exact = ev.exact(range(9), values)["loss"] - ev.run()["loss"][:, None]
    np.testing.assert_allclose(ev.estimate(values, "atpstar"), exact, rtol=1e-4, atol=1e-5)
    model = _toy("linear")
    ev = _toy_eval(model)
    values = ev.replacement(mode, 0)
    exact = ev.exact(range(6), values)["loss"] - ev.run()["loss"][:, None]
    est = ev.estimate(values, "atpstar")
    np.testing.assert_allclose(est[:, 3:], exact[:, 3:], rtol=1e-4, atol=1e-5)  # the last layer
    z, lengths = ev.head_outputs()  # layer 0: its direct effect r . o_proj(v - z) (mean over positions)
    v = values.per_sequence[:, 0] if mode == "resample" else values.vectors[None, 0, None]
    dz = (v - z[:, 0]).astype(np.float64)  # [S, n, H, d]
    W = model.model.layers[0].self_attn.o_proj.weight.detach().double().numpy().reshape(6, 3, 2)  # [D, H, d]
    r = model.r.weight.detach().double().numpy()[0]
    direct = np.einsum("snhd,khd,k->sh", dz, W, r) / z.shape[2]
    np.testing.assert_allclose(np.abs(est[:, :3]), np.abs(direct), rtol=1e-4, atol=1e-5)
    assert not np.allclose(est[:, :3], exact[:, :3], atol=1e-3)  # not the total effect


def test_layer_path_ig_measures_single_heads_on_a_saturating_toy():
    """Layer 1 saturates (its heads act through separate tanh channels) and reads layer 0's output,
    which mixes the heads. Integrated gradients along each layer's own path: a layer's estimates add
    up to the exact ablation of the whole layer, layer 1's single heads are exact (a path along all
    heads at once would move layer 0 too and miss them); where layer 0 saturates, 4 steps beat
    attribution patching."""
    from headatlas.ablation.tasks import _layer_path_estimate

    ev = _toy_eval(_toy("saturating", saturated=1))
    values = ev.replacement("zero", 0)
    intact = ev.run()["loss"]
    exact = ev.exact(range(6), values)["loss"] - intact[:, None]
    atp = ev.estimate(values, "atp")
    fine = ev.estimate(values, "ig", 64, max_rows=80)  # 2 blocks of 40 rows per pass: one layer each
    for layer in range(2):
        mask = np.zeros((2, 3), bool)
        mask[layer] = True
        whole = ev.run(mask, values)["loss"] - intact
        np.testing.assert_allclose(fine[:, 3 * layer : 3 * layer + 3].sum(1), whole, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(fine[:, 3:], exact[:, 3:], rtol=1e-3, atol=1e-3)
    assert np.abs(atp[:, 3:] - exact[:, 3:]).max() > 0.5  # saturated: the intact gradient misses it
    ig = ev.estimate(values, "ig", 4)
    ev.expand = False  # replicated inputs give the same estimates
    np.testing.assert_allclose(ev.estimate(values, "ig", 4), ig, rtol=1e-5, atol=1e-6)
    part = _layer_path_estimate(ev, values, 4, 4096, only=[1])  # one layer's share of the work
    assert np.isnan(part[:, :3]).all()
    np.testing.assert_allclose(part[:, 3:], ig[:, 3:], rtol=1e-5, atol=1e-6)
    ev = _toy_eval(_toy("saturating"))  # layer 0 saturates: 4 steps, 3 times closer than attribution patching
    values = ev.replacement("zero", 0)
    exact = ev.exact(range(6), values)["loss"] - ev.run()["loss"][:, None]
    error = {m: np.abs(ev.estimate(values, m, 4) - exact)[:, :3].mean() for m in ("atp", "ig")}
    assert error["ig"] < error["atp"] / 2


def test_saturating_toy_fails_the_layer_check_and_the_layer_is_marked():
    from headatlas.ablation.analysis import head_tables

    ev = _toy_eval(_toy("saturating"))
    s = AblationSettings(mode="zero", exact_max_heads=0, estimator="atp", check_heads=1, bootstrap=200,
                         on_check_fail="unreliable")  # fmt: skip
    heads, check = head_tables("toy", ev, s)
    layers = check[check["scope"] == "layer"].set_index("layer")
    assert not layers.loc[0, "passed"] and layers.loc[0, "action"] == "unreliable"
    assert layers.loc[1, "passed"]  # the linear layer: the estimate is exact
    l0 = heads[heads["layer"] == 0]
    sampled = l0["exact"].notna()
    assert sampled.sum() == 1 and (l0.loc[sampled, "kind"] == "exact").all()
    assert (l0.loc[~sampled, "kind"] == "unreliable").all() and l0.loc[~sampled, "effect"].isna().all()
    assert l0.loc[~sampled, "estimate"].notna().all()  # kept in its own column, never as the effect
    assert set(heads.loc[heads["layer"] == 1, "kind"]) <= {"exact", "estimated (checked)"}
    heads, check = head_tables("toy", ev, dataclass_replace(s, on_check_fail="exact"))
    assert (heads.loc[heads["layer"] == 0, "kind"] == "exact").all()  # the failing layer ablated exactly
    assert heads["effect"].notna().all()
    # split into exact jobs (one per layer): job 0 ablates its checked head, fails the check and ablates the rest
    # of layer 0; job 1 its checked head only; gathered, the same tables as one job
    from headatlas.ablation.analysis import exact_part

    parts = [exact_part(ev, dataclass_replace(s, on_check_fail="exact"), 2, k) for k in (0, 1)]
    assert parts[0]["heads"].tolist() == [0, 1, 2] and len(parts[1]["heads"]) == 1 and parts[1]["heads"][0] >= 3
    split = head_tables("toy", ev, dataclass_replace(s, on_check_fail="exact"), parts)
    for a, b in zip(split, (heads, check)):
        assert a.to_csv(sep="\t", index=False) == b.to_csv(sep="\t", index=False)


def test_model_without_lm_head_is_skipped_with_reason(ablation_models, ewt_records):
    from headatlas.ablation.tasks import evaluations
    from headatlas.atlas.analysis import ablation_columns

    evals, shape = evaluations(_spec(ablation_models / "bert_plain"), None, ewt_records, None, SMALL)
    assert evals["lm"][0] is None and "no masked-LM head" in evals["lm"][1]
    assert evals["classification"][0] is None and "not a fine-tuned classifier" in evals["classification"][1]
    heads, check = ablate_heads("bert_plain", evals, SMALL, shape)
    assert len(heads) == 2 * 2 * 4 and (heads["status"] == "skipped").all()
    assert (check["status"] == "skipped").all() and len(check) == 2
    cols = ablation_columns(heads)
    assert len(cols) == 8 and cols["ablation_lm_loss_method"].str.startswith("skipped: the checkpoint has no").all()
    assert cols["ablation_lm_loss_effect_kind"].str.startswith("skipped: the checkpoint has no").all()
    roles, pruning, removable = ablate_roles("bert_plain", evals, heads, {}, SMALL)
    assert (roles["status"] == "skipped").all() and (pruning["status"] == "skipped").all()
    assert (removable["status"] == "skipped").all()


def test_roles_and_pruning_on_a_tiny_decoder(ablation_models, ewt_records, tmp_path):
    from headatlas.ablation.figures import pruning_figure
    from headatlas.ablation.tasks import evaluations
    from headatlas.atlas.analysis import ablation_columns

    evals, shape = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)
    heads, _ = ablate_heads("llama_lm", evals, SMALL, shape)
    pande = pd.DataFrame({"layer": [0, 1], "head": [1, 2], "role": ["local", "local"], "significant_fdr": [True, True],
                          "effect": [2.0, 1.0]})  # fmt: skip
    roles, pruning, removable = ablate_roles("llama_lm", evals, heads, {"pande": pande}, SMALL)
    ok = roles[roles["status"] == "ok"]
    assert ok["role"].tolist() == ["pande_local"] and ok["n_heads"].iloc[0] == 2 and ok["layers"].iloc[0] == "1,1"
    p = pruning[(pruning["status"] == "ok")]
    assert sorted(set(p["n_removed"])) == [0, 2, 8]
    full = p[p["n_removed"] == 8]["value"].to_numpy()
    np.testing.assert_allclose(full, full[0])  # every order ends with every head removed
    pruning_figure(pruning, "llama_lm", tmp_path / "p.png", tmp_path / "p.svg")
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "p.svg").stat().st_size > 0
    r = removable[removable["status"] == "ok"].iloc[0]
    assert r["unit"] == "nats" and r["tolerance"] == 0.1 and 0 <= r["n_removable"] <= 8
    assert r["share_ci_low"] <= r["share_ci_high"] and r["share"] == r["n_removable"] / 8
    ev = evals["lm"][0]
    lm = heads[heads["task"] == "lm"].sort_values(["layer", "head"])
    order = np.lexsort((np.arange(8), lm["effect"].to_numpy()))
    k = int(r["n_removable"])
    mask = np.zeros(8, bool)
    mask[order[:k]] = True
    loss = ev.run(mask.reshape(2, 4), ev.replacement("mean", 0))["loss"].mean() if k else ev.run()["loss"].mean()
    assert loss - r["intact"] <= 0.1 + 1e-9 and r["value"] == pytest.approx(loss)
    cols = ablation_columns(heads)
    assert set(cols["ablation_lm_loss_effect_kind"]) == {"exact"} and set(cols["ablation_lm_loss_method"]) == {"exact"}
    assert cols["ablation_classification_accuracy_effect_kind"].str.startswith("skipped").all()


def test_atlas_columns_never_show_an_unreliable_estimate():
    from headatlas.atlas.analysis import ablation_columns

    kinds = ["exact", "unreliable", "estimated (checked)", "unreliable"]
    heads = pd.DataFrame({"model": "m", "task": "lm", "status": "ok", "reason": "", "layer": [0, 0, 1, 1],
                          "head": [0, 1, 0, 1], "metric": "loss", "effect": [0.5, 0.2, 0.1, 0.3], "ci_low": 0.0,
                          "ci_high": 1.0, "kind": kinds, "method": ["exact", "atp", "atp", "atp"]})  # fmt: skip
    cols = ablation_columns(heads)
    assert cols["ablation_lm_loss_effect"].isna().tolist() == [False, True, False, True]
    assert cols["ablation_lm_loss_ci_low"].isna().tolist() == [False, True, False, True]
    assert cols["ablation_lm_loss_effect_kind"].tolist() == kinds


def test_atlas_figure_marks_estimates_and_never_draws_unreliable_values():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from headatlas.atlas.figures import ablation_column, ablation_text, detector_panel

    assert ablation_text(0.123, "exact") == ("0.12", False)
    assert ablation_text(0.123, "estimated (checked)") == ("~0.12", True)
    assert ablation_text(0.5, "unreliable") == ("?", False)
    assert ablation_text(np.nan, "skipped: no LM head") == ("", False)
    atlas = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "ablation_lm_loss_effect": [np.nan] * 4, "ablation_lm_loss_effect_kind": ["skipped: x"] * 4,
                          "ablation_classification_accuracy_effect": [-0.02, 0.01, np.nan, np.nan],
                          "ablation_classification_accuracy_effect_kind": ["exact", "estimated (checked)", "unreliable",
                                                                           "skipped: y"]})  # fmt: skip
    assert ablation_column(atlas) == "ablation_classification_accuracy_effect"  # the lm column has no value
    fig, ax = plt.subplots()
    detector_panel(ax, atlas, 2, 2)
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["-0.02", "?", "~0.01"]
    assert sum(1 for p in ax.patches if p.get_hatch()) == 1  # only the estimate is hatched
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("accuracy, a share" in t for t in labels) and any("estimate" in t for t in labels)
    plt.close(fig)


@pytest.mark.parametrize("path", ["exact everywhere", "checked estimates"])
def test_split_exact_jobs_equal_one_job(ablation_models, ewt_records, tmp_path, path):
    """Rule ablation_exact's jobs (every k-th layer each), gathered: the same heads.tsv / check.tsv bytes as one job,
    with exact ablation of every head and with the check's heads only (a model past exact_max_heads)."""
    from headatlas.ablation.analysis import (
        ablate_heads,
        exact_heads,
        exact_part,
        job_heads,
        read_exact_parts,
        write_exact_part,
    )
    from headatlas.ablation.tasks import evaluations

    settings = SMALL if path == "exact everywhere" else dataclass_replace(SMALL, exact_max_heads=4, check_heads=2)
    assert job_heads(3, 2, 2, 0) == [0, 1, 4, 5] and job_heads(3, 2, 2, 1) == [2, 3] and job_heads(3, 2, 4, 3) == []
    evals, shape = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, settings)
    ev = evals["lm"][0]
    expected = list(range(8)) if path == "exact everywhere" else exact_heads(ev, settings)
    assert len(expected) == (8 if path == "exact everywhere" else 4)  # 2 layers x 2 checked heads
    check = ablate_heads("llama_lm", {"lm": (ev, None)}, settings, shape)[1]
    check = check[check["scope"] == "layer"]
    failing = set(check.loc[~check["passed"].astype(bool), "layer"].astype(int))
    tables = {}
    for jobs in (1, 2, 3):
        paths = []
        for part in range(jobs):
            paths.append(tmp_path / f"{jobs}_{part}.npz")
            write_exact_part(paths[-1], {"lm": exact_part(ev, settings, jobs, part), "classification": None})
        parts = read_exact_parts(paths)
        covered = sorted(np.concatenate([p["heads"] for p in parts["lm"]]))
        if path == "exact everywhere":
            assert covered == expected
        else:  # the checked heads, and every head of a layer failing the check
            assert set(expected) <= set(covered) and all(f in expected or f // 4 in failing for f in covered)
            assert all("estimate" in p and p["estimate"].shape == (6, 8) for p in parts["lm"])
        tables[jobs] = [t.to_csv(sep="\t", index=False, float_format="%.6g") for t in
                        ablate_heads("llama_lm", {"lm": (ev, None)}, settings, shape, parts)]  # fmt: skip
    tables[0] = [
        t.to_csv(sep="\t", index=False, float_format="%.6g")
        for t in ablate_heads("llama_lm", {"lm": (ev, None)}, settings, shape)
    ]  # fmt: skip: no parts, in the job
    assert tables[1] == tables[0] and tables[2] == tables[0] and tables[3] == tables[0]
    assert "exact" in tables[0][0]
    heads = pd.read_csv(pd.io.common.StringIO(tables[0][0]), sep="\t")
    loss = heads[heads["metric"] == "loss"].sort_values(["layer", "head"])
    exact = loss["kind"].to_numpy() == "exact"
    assert exact[expected].all() and set(loss["kind"]) <= {"exact", "estimated (checked)"}
