"""Ablations: the head patch, attribution patching, role and random sets, skip reasons, a tiny workflow run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.ablation.analysis import (
    AblationSettings,
    ablate_heads,
    ablate_roles,
    check_table,
    matched_random_sets,
    pruning_orders,
    role_sets,
    specialisation,
)
from headatlas.ablation.patch import HeadPatch, attribution_estimates, random_heads, replacement

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
    with HeadPatch([proj], H) as patch, patch.ablated(mask, values):
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
    with HeadPatch([proj, proj], H) as patch, patch.ablated(mask, values):  # one module serves two layers (ALBERT)
        patch.reset()
        first, second = proj(x), proj(x)
    assert first.tolist() == [[[1.0, 1.0]]] and second.tolist() == [[[5.0, 1.0]]]


def test_replacement_modes():
    means = np.ones((1, 2, 3))
    assert (replacement(means, "mean") == 1).all() and (replacement(means, "zero") == 0).all()
    with pytest.raises(ValueError, match="mean' or 'zero"):
        replacement(means, "half")


def test_attribution_equals_exact_ablation_on_a_linear_toy():
    """Metric linear in the head vectors: the first-order estimate is exact, per sequence."""
    import torch

    torch.manual_seed(0)
    S, n, H, d = 3, 5, 4, 2
    proj = torch.nn.Linear(H * d, 6)
    readout = torch.randn(6)
    z = torch.randn(S, n, H * d)
    means = z.reshape(-1, H, d).mean(0).numpy()[None]  # [1, H, d]

    def metric(x):  # per sequence, linear in the projection's input
        return (proj(x) @ readout).sum(1)

    with HeadPatch([proj], H) as patch:
        patch.capture = True
        patch.reset()
        zz = z.clone().requires_grad_(True)
        base = metric(zz)
        (g,) = torch.autograd.grad(base.sum(), patch.captured)
        patch.capture = False
        gs = g.reshape(S, n, H, d)
        grad_sums = gs.sum(1)[:, None].detach().numpy()  # [S, 1, H, d]
        zg = (zz.detach().reshape(S, n, H, d) * gs).sum((1, 3))[:, None].numpy()  # [S, 1, H]
        est = attribution_estimates(grad_sums, zg, replacement(means, "mean"))
        for h in range(H):
            mask = np.zeros((1, H), bool)
            mask[0, h] = True
            with torch.no_grad(), patch.ablated(mask, means):
                patch.reset()
                exact = (metric(z) - base).detach().numpy()
            np.testing.assert_allclose(est[:, 0, h], exact, rtol=1e-4, atol=1e-4)


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


def test_check_table_rank_and_overlap():
    est = np.array([3.0, 2.0, 1.0, 0.0])
    c = check_table("m", "lm", est, np.array([30.0, 10.0, 20.0, 0.0]), 2, 2)
    assert c["spearman"].iloc[0] == pytest.approx(0.8) and c["top_k_overlap"].iloc[0] == 1


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


SMALL = AblationSettings(lm_sequences=6, lm_max_tokens=24, exact_top=2, exact_random=2, random_sets=3, bootstrap=200,
                         pruning_fractions=(0.25, 1.0))  # fmt: skip


def test_zero_output_projection_head_has_zero_effect(ablation_models, ewt_records):
    from headatlas.ablation.analysis import head_tables
    from headatlas.ablation.tasks import evaluations

    evals, shape = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)
    ev, reason = evals["lm"]
    assert reason is None and shape == (2, 4)
    mask = np.zeros(shape, bool)
    mask[0, 1] = True
    values = np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32) * 10
    intact = ev.run()
    np.testing.assert_array_equal(ev.run(mask, values)["loss"], intact["loss"])  # exactly 0
    mask[0, 1], mask[1, 2] = False, True
    assert not np.array_equal(ev.run(mask, values)["loss"], intact["loss"])  # another head does matter
    heads, check, _ = head_tables("llama_lm", ev, SMALL)
    row = heads[(heads["layer"] == 0) & (heads["head"] == 1)].iloc[0]
    assert row["estimate"] == 0 and row["estimate_ci_low"] == 0
    assert set(heads["method"]) == {"exact", "estimated"} and (heads["method"] == "exact").sum() == 4
    assert check["n_exact"].iloc[0] == 4


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
    roles, pruning = ablate_roles("bert_plain", evals, heads, {}, SMALL)
    assert (roles["status"] == "skipped").all() and (pruning["status"] == "skipped").all()


def test_roles_and_pruning_on_a_tiny_decoder(ablation_models, ewt_records, tmp_path):
    from headatlas.ablation.figures import pruning_figure
    from headatlas.ablation.tasks import evaluations
    from headatlas.atlas.analysis import ablation_columns

    evals, shape = evaluations(_spec(ablation_models / "llama_lm"), None, ewt_records, None, SMALL)
    heads, _ = ablate_heads("llama_lm", evals, SMALL, shape)
    pande = pd.DataFrame({"layer": [0, 1], "head": [1, 2], "role": ["local", "local"], "significant_fdr": [True, True],
                          "effect": [2.0, 1.0]})  # fmt: skip
    roles, pruning = ablate_roles("llama_lm", evals, heads, {"pande": pande}, SMALL)
    ok = roles[roles["status"] == "ok"]
    assert ok["role"].tolist() == ["pande_local"] and ok["n_heads"].iloc[0] == 2 and ok["layers"].iloc[0] == "1,1"
    p = pruning[(pruning["status"] == "ok")]
    assert sorted(set(p["n_removed"])) == [0, 2, 8]
    full = p[p["n_removed"] == 8]["value"].to_numpy()
    np.testing.assert_allclose(full, full[0])  # every order ends with every head removed
    pruning_figure(pruning, "llama_lm", tmp_path / "p.png", tmp_path / "p.svg")
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "p.svg").stat().st_size > 0
    cols = ablation_columns(heads)
    assert set(cols["ablation_lm_loss_method"]) == {"exact", "estimated"}
    assert cols["ablation_classification_accuracy_method"].str.startswith("skipped").all()


@pytest.mark.slow
def test_tiny_workflow_ablation(tmp_path):
    """The real rules on the tiny workflow's models: heads, check, roles, pruning and the atlas columns."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tiny_workflow import write_tiny

    cfg = write_tiny(tmp_path, analyses=["clark_surface", "ablation"], corpora=["wiki"], limit=8)
    os.symlink(Path(__file__).resolve().parents[1] / "resources", tmp_path / "resources")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    targets = [f"results/ablation/{m}/pruning.png" for m in ("tinybert", "tinygpt2")] + [
        f"results/atlas/{m}/atlas.tsv" for m in ("tinybert", "tinygpt2")
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(repo / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(cfg), "--cores", "2", *targets],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    res = tmp_path / "results"
    heads = pd.read_csv(res / "ablation/tinygpt2/heads.tsv", sep="\t")
    lm = heads[heads["task"] == "lm"]
    assert len(lm) == 8 and (lm["status"] == "ok").all()
    bert = pd.read_csv(res / "ablation/tinybert/heads.tsv", sep="\t")
    assert (bert["status"] == "skipped").all()
    assert "no masked-LM head" in (tmp_path / "logs/ablation_heads/tinybert.log").read_text()
    roles = pd.read_csv(res / "ablation/tinygpt2/roles.tsv", sep="\t")
    assert "status" in roles
    atlas = pd.read_csv(res / "atlas/tinybert/atlas.tsv", sep="\t")
    assert atlas["ablation_lm_loss_method"].str.startswith("skipped").all()
    for m in ("tinybert", "tinygpt2"):
        assert (res / f"ablation/{m}/pruning.svg").is_file()
