"""Dormant by zero-ablation (headatlas.quiet.analysis.zero_ablation): on a hand-built tiny Llama a head whose output
is exactly zero changes nothing when zero-ablated (effect and CI 0: null, dormant) and a head whose output dominates
the logits does (CI excludes 0); the batched exact zero-ablation equals one-at-a-time zero-ablation; the join and
the summary count the heads dormant by zero-ablation among those ablated exactly; an encoder is skipped."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.quiet.analysis import QuietSettings, heads_table, summary_table, zero_ablation, zero_table

SILENT, LOUD = (0, 1), (1, 2)  # (layer, head): zero output; the one head that carries the prediction
SETTINGS = QuietSettings(n_sequences=6, length=16, batch_size=6, ablation_sequences=6, bootstrap=200)


@pytest.fixture(scope="module")
def zero_models(tmp_path_factory, bpe_tokenizer_object, records):
    """A tiny Llama with its causal-LM head (one KV head per query head) in which head SILENT reads zero values (its
    output sum_j A_ij v_j is exactly 0) and only head LOUD writes into the residual stream (every other head's output
    projection and both MLPs are zero): trained on the natural inputs for 100 steps with those weights held at 0,
    LOUD carries what the model learnt beyond the direct embedding-unembedding path."""
    import torch
    from conftest import tiny_llama_config
    from transformers import AutoTokenizer, LlamaForCausalLM

    from headatlas.ablation.tasks import token_evaluation
    from headatlas.core.batching import pad_token
    from headatlas.core.models import decoder_bos
    from headatlas.quiet.analysis import natural_inputs

    root = tmp_path_factory.mktemp("zero_models")
    bpe = bpe_tokenizer_object
    torch.manual_seed(3)
    cfg = tiny_llama_config(len(bpe), bpe.bos_token_id, num_key_value_heads=4, pad_token_id=None)
    llama = LlamaForCausalLM(cfg)
    d = cfg.hidden_size // cfg.num_attention_heads

    def hold_zero():
        with torch.no_grad():
            for i, block in enumerate(llama.model.layers):
                block.mlp.down_proj.weight.zero_()
                for h in range(cfg.num_attention_heads):
                    if (i, h) != LOUD:
                        block.self_attn.o_proj.weight[:, h * d : (h + 1) * d] = 0
            layer, head = SILENT
            llama.model.layers[layer].self_attn.v_proj.weight[head * d : (head + 1) * d] = 0

    bpe.save_pretrained(root / "llama_lm")
    tokenizer = AutoTokenizer.from_pretrained(root / "llama_lm")
    bos = decoder_bos(tokenizer, cfg, _spec(root / "llama_lm"))
    tokenized, _ = natural_inputs({"c": records}, tokenizer, "decoder", bos, SETTINGS)
    ev = token_evaluation(llama, tokenized, pad_token(tokenizer), SETTINGS.batch_size, cfg)
    opt = torch.optim.Adam(llama.parameters(), lr=1e-2)
    hold_zero()
    llama.train()
    for _ in range(100):
        for inputs, targets, _pos in ev.batches:
            opt.zero_grad()
            ev._metrics(llama(**inputs), targets)[0].mean().backward()
            opt.step()
            hold_zero()
    llama.eval()
    llama.save_pretrained(root / "llama_lm")
    return root


def _spec(path):
    from headatlas.core.models import ModelSpec

    return ModelSpec.from_config({"name": path.name, "source": {"path": str(path)}, "max_length": 64, "device": "cpu"})


def _flat(layer_head, n_heads=4):
    return layer_head[0] * n_heads + layer_head[1]


def test_zero_output_head_is_dormant_and_loud_head_is_not(zero_models, records):
    zero, check = zero_ablation(_spec(zero_models / "llama_lm"), None, {"c": records}, SETTINGS, "cpu")
    assert len(zero) == 8 and (zero["quiet_zero_effect_kind"] == "exact").all()  # 8 heads <= exact_max_heads
    assert (zero["zero_sequences"] == 6).all() and (zero["zero_method"] == "exact").all()
    z = zero.set_index(["layer", "head"])
    silent, loud = z.loc[SILENT], z.loc[LOUD]
    assert silent["quiet_zero_effect"] == 0 and silent["quiet_zero_effect_ci_low"] == 0
    assert silent["quiet_zero_effect_ci_high"] == 0 and silent["quiet_zero_null"]
    assert loud["quiet_zero_effect_ci_low"] > 0 or loud["quiet_zero_effect_ci_high"] < 0
    assert not loud["quiet_zero_null"] and abs(loud["quiet_zero_effect"]) > 0.1
    ci = zero[["quiet_zero_effect_ci_low", "quiet_zero_effect_ci_high"]].to_numpy()
    assert (zero["quiet_zero_null"] == ((ci[:, 0] <= 0) & (ci[:, 1] >= 0))).all()
    assert check.loc[check["scope"] == "exact heads", "n_compared"].iloc[0] == 8


def test_batched_exact_zero_ablation_equals_one_at_a_time(zero_models, records):
    """The quiet analysis's Evaluation (its natural inputs) through the ablation's batched exact patching, against
    one head ablated at a time with a mask; expanded inside the model and with replicated inputs."""
    from transformers import AutoConfig, AutoTokenizer

    from headatlas.ablation.tasks import token_evaluation
    from headatlas.core.batching import pad_token
    from headatlas.core.models import decoder_bos, lm_head_model
    from headatlas.quiet.analysis import natural_inputs

    path = str(zero_models / "llama_lm")
    config, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model, _ = lm_head_model(path, "decoder")
    bos = decoder_bos(tokenizer, config, _spec(zero_models / "llama_lm"))
    tokenized, _ = natural_inputs({"c": records}, tokenizer, "decoder", bos, SETTINGS)
    ev = token_evaluation(model, tokenized, pad_token(tokenizer), 4, config)
    values = ev.replacement("zero", 0)
    assert not values.vectors.any()
    flat = list(range(8))
    one = []
    for f in flat:
        mask = np.zeros((2, 4), bool)
        mask.flat[f] = True
        one.append(ev.run(mask, values)["loss"])
    one = np.stack(one, 1)
    np.testing.assert_array_equal(one[:, _flat(SILENT)], ev.run()["loss"])
    assert ev.expand
    for max_rows in (10**6, 1):  # every head in one pass; one head per pass
        np.testing.assert_allclose(ev.exact(flat, values, max_rows)["loss"], one, rtol=1e-5, atol=1e-5)
    ev.expand = False
    np.testing.assert_allclose(ev.exact(flat, values)["loss"], one, rtol=1e-5, atol=1e-5)


def test_encoder_and_switched_off_are_skipped_on_every_head(tiny_models, records):
    from headatlas.core.models import ModelSpec

    spec = ModelSpec.from_config({"name": "bert", "source": {"path": str(tiny_models["bert"])}, "device": "cpu"})
    zero, check = zero_ablation(spec, None, {"c": records}, SETTINGS, "cpu")
    assert zero["quiet_zero_effect_kind"].str.startswith("skipped: an encoder").all()
    assert zero["quiet_zero_null"].isna().all() and zero["quiet_zero_effect"].isna().all()
    assert (check["status"] == "skipped").all()
    off = QuietSettings(ablation_sequences=0)
    zero, _ = zero_ablation(spec, None, {"c": records}, off, "cpu")
    assert (zero["quiet_zero_effect_kind"] == "skipped: analysis.quiet.ablation_sequences is 0").all()
    with pytest.raises(ValueError, match="ablation_sequences"):
        QuietSettings(ablation_sequences=1)


def _ablation_heads(effect, lo, hi, kind) -> pd.DataFrame:
    """A loss table as :func:`headatlas.ablation.analysis.head_tables` writes it, for 2 x 2 heads."""
    layer, head = np.divmod(np.arange(4), 2)
    return pd.DataFrame({"model": "m", "layer": layer, "head": head, "label": [f"{a + 1}-{b + 1}" for a, b in
                         zip(layer, head)], "metric": "loss", "effect": effect, "ci_low": lo, "ci_high": hi,
                         "kind": kind, "method": "exact", "intact": 3.0, "n_sequences": 5})  # fmt: skip


def test_join_and_summary_count_dormant_heads_among_the_exact_ones(tmp_path):
    from headatlas.core.io import write_tsv

    stats = pd.DataFrame({"model": "m", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "n_sequences": 4,
                          "quiet_massive_first": 0.0, "quiet_positional_head": False, "quiet_positional_offset": -1,
                          "quiet_max_weight": 0.5, "quiet_norm_rel": 1.0, "quiet_entropy_var": 0.1})  # fmt: skip
    kind = ["exact", "exact", "estimated (checked)", "unreliable"]
    heads = _ablation_heads([0.5, 0.01, 0.0, np.nan], [0.4, -0.01, -0.1, np.nan], [0.6, 0.03, 0.1, np.nan], kind)
    zero = zero_table(heads)
    assert zero["quiet_zero_null"].tolist() == [False, True, True, pd.NA]
    write_tsv(zero, tmp_path / "zero.tsv")  # through the TSV, as rule quiet_heads reads it
    zero = pd.read_csv(tmp_path / "zero.tsv", sep="\t")
    h = heads_table(stats, None, zero, QuietSettings())
    assert h["quiet_zero_null"].tolist() == [False, True, True, pd.NA]
    assert h["quiet_zero_null_kind"].tolist() == kind
    s = summary_table(h, QuietSettings(), zero).iloc[0]
    assert (s["zero_exact_heads"], s["zero_null_exact_heads"], s["zero_null_share"]) == (2, 1, 0.5)
    assert (s["zero_estimated_heads"], s["zero_null_estimated_heads"], s["zero_unreliable_heads"]) == (1, 1, 1)
    assert (s["zero_sequences"], s["zero_intact_loss"]) == (5, 3.0)
    with pytest.raises(ValueError, match="zero_ablation.tsv"):
        heads_table(stats, None, zero.iloc[:3], QuietSettings())
    none = heads_table(stats, None, None, QuietSettings())
    assert none["quiet_zero_effect_kind"].str.startswith("skipped").all() and none["quiet_zero_null"].isna().all()


def _other_values(settings: QuietSettings, keys) -> QuietSettings:
    """``settings`` with every key of ``keys`` set to another valid value."""
    from dataclasses import replace

    other = {"positional_share": 0.5, "massive_threshold": 1e-3, "massive_ratio": 1.5, "sink_massive_share": 0.1,
             "ablation_sequences": 0, "exact_max_heads": 0, "exact_max_rows": 7, "check_heads": 1, "check_seed": 5,
             "on_check_fail": "unreliable"}  # fmt: skip
    return replace(settings, **{k: other[k] for k in keys})


def test_each_model_rule_reads_only_its_own_keys(tiny_loaded, zero_models, records):
    """Rule quiet's params leave out the zero-ablation keys and rule quiet_ablation's the statistics keys (so a
    changed key reruns only the job that reads it): changing every left-out key changes neither rule's tables."""
    from headatlas.quiet.analysis import run_quiet

    assert set(QuietSettings.ZERO_ABLATION_KEYS).isdisjoint(QuietSettings.rule_keys("quiet"))
    assert set(QuietSettings.STATISTICS_KEYS).isdisjoint(QuietSettings.rule_keys("quiet_ablation"))
    spec, model, tokenizer, config = tiny_loaded("llama")
    left_out = [*QuietSettings.ZERO_ABLATION_KEYS, "sink_massive_share"]
    a = run_quiet(spec, model, tokenizer, config, {"c": records}, SETTINGS)
    b = run_quiet(spec, model, tokenizer, config, {"c": records}, _other_values(SETTINGS, left_out))
    for key in a:
        pd.testing.assert_frame_equal(a[key], b[key])
    spec = _spec(zero_models / "llama_lm")
    left_out = [*QuietSettings.STATISTICS_KEYS, "sink_massive_share"]
    a = zero_ablation(spec, None, {"c": records}, SETTINGS, "cpu")
    b = zero_ablation(spec, None, {"c": records}, _other_values(SETTINGS, left_out), "cpu")
    for x, y in zip(a, b):
        pd.testing.assert_frame_equal(x, y)
