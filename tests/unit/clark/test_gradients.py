"""Gradient importance (Clark et al. Fig. 3): masking, key types, per-type sums, tiny LM-head models."""

from __future__ import annotations

import numpy as np
import pytest

from headatlas.clark.gradients import KEY_TYPES, group_sums, key_types, mlm_inputs
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP
from headatlas.core.models import lm_head_model

K = {k: i for i, k in enumerate(KEY_TYPES)}


def test_key_types_encoder_and_decoder():
    special = np.array([SPECIAL_CLS, 0, 0, 0, SPECIAL_SEP, 0, SPECIAL_SEP])
    piece = ["[CLS]", "a", ".", "b", "[SEP]", "Ġ,", "[SEP]"]
    assert key_types(special, piece, causal=False).tolist() == [
        K["cls"],
        K["other"],
        K["punct"],
        K["other"],
        K["sep_bos"],
        K["punct"],
        K["sep_bos"],
    ]
    dec = np.array([SPECIAL_BOS, 0, 0])
    assert key_types(dec, ["<s>", "Ġ.", "x"], causal=True).tolist() == [K["sep_bos"], K["punct"], K["other"]]


def test_mlm_inputs_mask_only_ordinary_tokens():
    n = 2000
    ids = np.arange(10, 10 + n)
    special = np.zeros(n, int)
    special[[0, 999, n - 1]] = [SPECIAL_CLS, SPECIAL_SEP, SPECIAL_SEP]
    out, labels = mlm_inputs(ids, special, np.random.default_rng(0), 0.15, mask_id=3, vocab_size=50)
    chosen = np.flatnonzero(labels != -100)
    assert len(chosen) == round(0.15 * (n - 3))
    assert not set(chosen) & {0, 999, n - 1}
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    unchosen = np.setdiff1d(np.arange(n), chosen)
    np.testing.assert_array_equal(out[unchosen], ids[unchosen])
    masked = (out[chosen] == 3).mean()
    kept = (out[chosen] == ids[chosen]).mean()
    assert 0.75 < masked < 0.85 and 0.06 < kept < 0.14


def test_mlm_inputs_mask_at_least_one_token():
    _, labels = mlm_inputs(
        np.array([1, 5, 2]), np.array([SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP]), np.random.default_rng(0), 0.15, 3, 10
    )
    assert (labels != -100).sum() == 1


def test_group_sums_known_answer_and_causal_mask():
    grad = -np.ones((2, 3, 3))  # |g| = 1 everywhere
    types = np.array([K["sep_bos"], K["punct"], K["other"]])
    s, c = group_sums(grad, types, len(KEY_TYPES), causal=False)
    np.testing.assert_array_equal(c, [6, 6, 0, 6])
    np.testing.assert_array_equal(s, [6, 6, 0, 6])
    grad[:, 0, 1:] = 100.0  # cells above the diagonal must not count under a causal mask
    s, c = group_sums(grad, types, len(KEY_TYPES), causal=True)
    np.testing.assert_array_equal(c, [6, 4, 0, 2])  # key j is seen by rows j..2, in 2 heads
    np.testing.assert_array_equal(s, c)


# --- tiny models with LM heads --------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_models(tmp_path_factory, bert_vocab_file, bpe_tokenizer_object):
    """A tiny BERT with its masked-LM head, a tiny Llama with its causal-LM head and a tiny
    BERT without a head, each saved with its tokenizer."""
    import torch
    from conftest import tiny_llama_config
    from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast, LlamaForCausalLM

    root = tmp_path_factory.mktemp("lm_models")
    wp = BertTokenizerFast(vocab=str(bert_vocab_file), do_lower_case=True)
    cfg = BertConfig(
        vocab_size=len(wp),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(root / "bert_mlm")
    wp.save_pretrained(root / "bert_mlm")
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(root / "bert_plain")
    wp.save_pretrained(root / "bert_plain")
    bpe = bpe_tokenizer_object
    eot = bpe.bos_token_id
    torch.manual_seed(1)
    # pad_token_id None: a padding_idx would zero BOS's embedding (BOS = pad here) and its gradients
    llama = LlamaForCausalLM(
        tiny_llama_config(len(bpe), eot, max_position_embeddings=128, pad_token_id=None, tie_word_embeddings=True)
    )
    llama.save_pretrained(root / "llama_lm")
    bpe.save_pretrained(root / "llama_lm")
    return root


def spec_of(path, **kw):
    from headatlas.core.models import ModelSpec

    return ModelSpec.from_config(
        {"name": path.name, "source": {"path": str(path)}, "max_length": 64, "batch_size": 4, **kw}
    )


def test_model_without_lm_head_is_skipped_with_a_reason(lm_models, ewt_records):
    from headatlas.clark.gradients import gradient_table

    model, reason = lm_head_model(str(lm_models / "bert_plain"), "encoder")
    assert model is None and "no masked-LM head" in reason and "cls.predictions" in reason
    table = gradient_table(spec_of(lm_models / "bert_plain"), ewt_records, n_segments=2, device="cpu")
    assert table["status"].tolist() == ["skipped"] and "masked-LM" in table["reason"].iloc[0]


@pytest.mark.parametrize("name,kind", [("bert_mlm", "encoder"), ("llama_lm", "decoder")])
def test_gradients_per_sequence_do_not_depend_on_batching(lm_models, ewt_records, name, kind):
    from transformers import AutoTokenizer

    from headatlas.clark.gradients import gradient_importance
    from headatlas.core.align import bos_id
    from headatlas.core.extract import tokenize_records

    model, reason = lm_head_model(str(lm_models / name), kind)
    assert reason is None
    tok = AutoTokenizer.from_pretrained(lm_models / name)
    bos = bos_id(tok, "auto") if kind == "decoder" else None
    seqs, _ = tokenize_records(ewt_records[:5], tok, kind, 64, "skip", bos)
    s1, c1, l1 = gradient_importance(model, tok, seqs, kind, seed=3, batch_size=1)
    s3, c3, l3 = gradient_importance(model, tok, seqs, kind, seed=3, batch_size=3)
    np.testing.assert_array_equal(c1, c3)
    np.testing.assert_allclose(s1, s3, rtol=1e-4, atol=1e-10)
    assert l1 == pytest.approx(l3, rel=1e-5)
    assert s1.shape == (2, len(KEY_TYPES)) and (s1[c1 > 0] > 0).all()
    n_cells = sum(len(t) ** 2 if kind == "encoder" else len(t) * (len(t) + 1) // 2 for t in seqs) * 4
    assert c1[0].sum() == n_cells
    if kind == "decoder":
        assert c1[:, K["sep_bos"]].min() > 0 and c1[:, K["cls"]].max() == 0
    else:
        assert c1[:, K["cls"]].min() > 0


def test_gradient_table_for_a_causal_model(lm_models, ewt_records):
    from headatlas.clark.gradients import gradient_table

    table = gradient_table(
        spec_of(lm_models / "llama_lm"), ewt_records, overflow="truncate", n_segments=3, device="cpu"
    )
    assert set(table["status"]) == {"ok"} and set(table["loss_kind"]) == {"causal_lm"}
    assert set(table["key_type"]) <= set(KEY_TYPES) and "sep_bos" in set(table["key_type"])
    assert table["n_sequences"].iloc[0] == 3 and np.isfinite(table["mean_abs_grad"]).all()


def test_gradient_figure_renders_both_cases(tmp_path):
    import pandas as pd

    from headatlas.clark.figures import fig3_gradients
    from headatlas.clark.gradients import importance_table, skipped_table
    from headatlas.core.figures import save_figure

    sums = np.array([[1.0, 2.0, 0.0, 3.0], [0.5, 1.0, 0.0, 2.0]])
    counts = np.array([[10, 10, 0, 10], [10, 10, 0, 10]])
    ok = importance_table("m", "decoder", sums, counts, 2, 3.0)
    assert ok["key_type"].tolist() == ["sep_bos", "punct", "other"] * 2
    assert ok["mean_abs_grad"].iloc[0] == pytest.approx(0.1)
    save_figure(fig3_gradients(ok, "m", "wiki"), tmp_path / "ok.png", tmp_path / "ok.svg")
    save_figure(
        fig3_gradients(skipped_table("m", "encoder", "no head"), "m", "wiki"),
        tmp_path / "skip.png",
        tmp_path / "skip.svg",
    )
    assert (tmp_path / "ok.png").stat().st_size > 1000 and (tmp_path / "skip.png").is_file()
    assert isinstance(ok, pd.DataFrame)


@pytest.mark.parametrize("name,kind", [("bert_mlm", "encoder"), ("llama_lm", "decoder")])
def test_retained_attention_grad_is_the_gradient_of_the_weights_used(lm_models, name, kind):
    """sum_j A_ij dL/dA_ij must equal dL/dctx_i . ctx_i, with ctx_i = sum_j A_ij v_j the head's
    context vector (the input of the output projection): true only if the retained tensor is
    the one multiplied with the values."""
    import torch

    from headatlas.core.extract import head_output_modules

    model, _ = lm_head_model(str(lm_models / name), kind)
    for p in model.parameters():
        p.requires_grad_(False)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    captured = {}

    def hook(layer):
        def f(module, args):
            args[0].retain_grad()
            captured[layer] = args[0]

        return f

    hooks = [m.register_forward_pre_hook(hook(i)) for i, m in enumerate(head_output_modules(model, n_layers))]
    ids = torch.tensor([[2, 7, 8, 9, 10, 11, 3]])
    emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with torch.enable_grad():
        out = model(inputs_embeds=emb, output_attentions=True)
        for a in out.attentions:
            a.retain_grad()
        out.logits.float().pow(2).mean().backward()
    for h in hooks:
        h.remove()
    for layer, a in enumerate(out.attentions):
        lhs = (a * a.grad).sum(-1)[0]  # [H, n]
        ctx, g = captured[layer][0], captured[layer].grad[0]  # [n, H*d]
        rhs = (ctx * g).reshape(ctx.shape[0], n_heads, -1).sum(-1).T  # [H, n]
        torch.testing.assert_close(lhs, rhs, rtol=1e-4, atol=1e-7)
        assert a.grad.abs().sum() > 0


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bert_mlm", "llama_lm"])
def test_gradient_table_on_cuda_matches_cpu(lm_models, ewt_records, name):
    from headatlas.clark.gradients import gradient_table

    spec = spec_of(lm_models / name)
    cpu = gradient_table(spec, ewt_records, overflow="truncate", n_segments=4, device="cpu")
    gpu = gradient_table(spec, ewt_records, overflow="truncate", n_segments=4, device="cuda")
    assert (gpu["status"] == "ok").all()
    num = cpu.select_dtypes("number").columns
    np.testing.assert_allclose(gpu[num].to_numpy(float), cpu[num].to_numpy(float), rtol=1e-3, atol=1e-9)
