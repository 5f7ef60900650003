"""Fine-tuning a config model into a derived model, and the heads-hypothesis DAG around it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import RESOURCES, run_snakemake, tiny_spec

from headatlas.core.corpora import CorpusError, tsv_records
from headatlas.core.finetune import METRICS_FILE, finetune, label_index, length_bucketed_batches, read_metrics

SST2_TRAIN = RESOURCES / "sst2" / "sentiment-train.tsv"
SICK_TRAIN = RESOURCES / "sick" / "sicktrain-ent.tsv"


def head_lines(src: Path, dst: Path, n: int) -> Path:
    with open(src, encoding="utf-8") as fh:
        dst.write_text("".join(next(fh) for _ in range(n)), encoding="utf-8")
    return dst


def test_length_bucketed_batches_are_seeded_and_cover_steps():
    lengths = np.random.default_rng(0).integers(1, 60, size=1000)
    a = length_bucketed_batches(lengths, 32, 50, np.random.default_rng(7))
    b = length_bucketed_batches(lengths, 32, 50, np.random.default_rng(7))
    c = length_bucketed_batches(lengths, 32, 50, np.random.default_rng(8))
    assert len(a) == 50 and all(len(x) == 32 for x in a)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))
    first_epoch = np.concatenate(a[: 1000 // 32])
    assert len(np.unique(first_epoch)) == len(first_epoch)  # no example twice within an epoch
    spread = np.mean([lengths[x].max() - lengths[x].min() for x in a])
    assert spread < 10  # batches of similar length (random batches would spread ~55)
    assert len(length_bucketed_batches(lengths[:5], 32, 3, np.random.default_rng(0))) == 3  # tiny train set


def test_label_index_checks_dev_labels(tmp_path):
    train = tmp_path / "train.tsv"
    dev = tmp_path / "dev.tsv"
    train.write_text("a b\tpos\nc d\tneg\n", encoding="utf-8")
    dev.write_text("e f\tpos\ng h\tneutral\n", encoding="utf-8")
    task = {"train": str(train), "dev": str(dev), "label_column": 1}
    tr, dv = tsv_records(train, 1, 1), tsv_records(dev, 1, 1)
    with pytest.raises(CorpusError, match="neutral"):
        label_index(tr, dv, task)
    assert label_index(tr, tr, task) == ["neg", "pos"]
    one = tmp_path / "one.tsv"
    one.write_text("a b\tpos\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="distinct"):
        label_index(tsv_records(one, 1, 1), [], dict(task, train=str(one)))


def test_evaluate_batches_by_length_and_keeps_each_label_with_its_record(tmp_path, bert_tokenizer):
    """A stand-in classifier predicts the parity of each input's token count, so a record scored against another
    record's label (batches are sorted by length) would lose about half the accuracy."""
    import torch

    from headatlas.core.finetune import encode_records, evaluate

    class Parity(torch.nn.Module):
        def forward(self, attention_mask, **_):
            n = attention_mask.sum(1)
            return SimpleNamespace(logits=torch.stack([n % 2 == 0, n % 2 == 1], 1).float())

    records = tsv_records(head_lines(SST2_TRAIN, tmp_path / "dev.tsv", 40), 1, 1)
    n_tokens = np.array([int(encode_records(bert_tokenizer, [r], 32)["attention_mask"].sum()) for r in records])
    assert len(set(n_tokens % 2)) == 2 and len(set(n_tokens)) > 5
    parity = n_tokens % 2
    for batch_size in (1, 7, 64):
        assert evaluate(Parity(), bert_tokenizer, records, parity, 32, batch_size) == 1.0
        assert evaluate(Parity(), bert_tokenizer, records, 1 - parity, 32, batch_size) == 0.0


@pytest.mark.parametrize("name,train_src,cols", [("bert", SST2_TRAIN, 1), ("gpt2", SICK_TRAIN, 2)])
def test_finetune_tiny_model_writes_a_loadable_checkpoint(tmp_path, tiny_models, name, train_src, cols):
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore

    train = head_lines(train_src, tmp_path / "train.tsv", 64)
    dev = head_lines(train_src, tmp_path / "dev.tsv", 24)
    task = {"name": "toy", "train": str(train), "dev": str(dev), "text_columns": cols, "label_column": cols,
            "steps": 4, "batch_size": 8, "max_length": 32, "lr": 1e-3, "seed": 0, "dev_limit": 20}  # fmt: skip
    base = tiny_spec(name, tiny_models[name])
    out = tmp_path / "ft"
    metrics = finetune(base, None, task, str(out), threads=1)
    assert (out / "config.json").is_file() and (out / METRICS_FILE).is_file()
    assert not list(tmp_path.glob("ft.tmp*"))
    assert read_metrics(out) == json.loads(json.dumps(metrics))
    assert metrics["steps"] == 4 and len(metrics["labels"]) >= 2
    assert metrics["dev_size"] == 20  # the first 20 of the 24 dev lines
    assert 0 <= metrics["dev_accuracy"] <= 1 and 0 < metrics["majority_baseline"] <= 1
    # the extraction loads it as a derived model (AutoModel drops the classifier) and stores maps
    spec = ModelSpec.from_config(
        {"name": "ft", "source": {"finetuned": {"base": name, "task": "toy"}}, "max_length": 200}
    )
    model, tokenizer, config = load(spec, out, device="cpu")
    records = tsv_records(dev, cols, cols)[:5]
    extract(records, spec, model, tokenizer, config, tmp_path / "store", ExtractSettings(reps=False))
    with AttentionStore(tmp_path / "store") as st:
        assert len(st) == 5
    # fine-tuning changed the encoder weights, and the same seed gives the same weights
    from transformers import AutoModel

    before = AutoModel.from_pretrained(tiny_models[name]).state_dict()
    after = model.state_dict()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before if k in after)
    again = tmp_path / "ft2"
    finetune(base, None, task, str(again), threads=1)
    m2 = AutoModel.from_pretrained(again).state_dict()
    assert all(np.array_equal(after[k].numpy(), m2[k].numpy()) for k in after)


@pytest.mark.slow
def test_pande_dag_with_a_finetuned_model(tmp_path, tiny_models):
    """Base + fine-tuned tiny BERT through the real DAG: TSVs, figures, comparison, bad input."""
    r = RESOURCES
    config = {
        "models": [
            {"name": "tb", "source": {"path": str(tiny_models["bert"])}, "max_length": 200, "batch_size": 8, "device": "cpu"},
            {"name": "tb-ft", "source": {"finetuned": {"base": "tb", "task": "toy"}}},
        ],
        "finetune_tasks": {
            "toy": {"train": str(head_lines(SST2_TRAIN, tmp_path / "train.tsv", 64)), "dev": str(head_lines(SST2_TRAIN, tmp_path / "dev.tsv", 16)),
                    "text_columns": 1, "label_column": 1, "steps": 3, "batch_size": 8, "max_length": 32, "threads": 1},
        },
        "corpora": {"sick": {"kind": "tsv", "path": str(r / "sick" / "sicktest-ent.tsv"), "text_columns": 2, "label_column": 2, "limit": 10}},
        "extraction": {"threads": 1},
        "analysis": {"pande": {"corpora": ["sick"], "relations": ["nsubj", "obj", "iobj"], "bootstrap": 50, "permutations": 50}},
    }  # fmt: skip
    targets = [f"results/pande/tb/{f}" for f in ("role_grid.png", "heatmap.png", "summary.json")]
    targets += [f"results/pande/tb-ft/finetune_{f}" for f in ("compare.tsv", "roles_by_layer.png", "sep_by_layer.png")]
    proc = run_snakemake(tmp_path, config, *targets)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results/pande/tb/heads.tsv", sep="\t")
    assert len(t) == 2 * 4 * 9  # 2 layers x 4 heads x (5 token roles + the union + 3 relations)
    assert list(t.columns[:4]) == ["model", "layer", "head", "role"]
    iobj = t[t["role"] == "syntactic_iobj"]
    assert (iobj["n"] == 0).all() and iobj["p"].isna().all() and iobj["note"].str.contains("iobj").all()
    assert (t.loc[t["role"] == "block", "n"] == 10).all()  # SICK pairs, parsed by spaCy
    assert (t.loc[t["role"] == "syntactic_obj", "n"] > 0).all()  # spaCy's dobj counts as obj
    assert "relation iobj" in (tmp_path / "logs/pande_test/tb.log").read_text()
    cmp = pd.read_csv(tmp_path / "results/pande/tb-ft/finetune_compare.tsv", sep="\t")
    assert set(cmp["role"]) == set(t["role"]) and cmp["layer"].nunique() == 2
    assert (tmp_path / "results/models/finetuned/tb-ft" / METRICS_FILE).is_file()
    # tau <= 0 is refused by the schema before any job runs, naming the key; the table stays as it was
    config["analysis"]["pande"]["tau"] = 0
    proc = run_snakemake(tmp_path, config, "results/pande/tb/heads.tsv")
    assert (
        proc.returncode != 0 and "config key analysis.pande.tau: 0 is less than or equal to the minimum" in proc.stderr
    )
    assert pd.read_csv(tmp_path / "results/pande/tb/heads.tsv", sep="\t").equals(t)
