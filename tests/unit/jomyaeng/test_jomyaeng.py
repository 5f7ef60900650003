"""Jo & Myaeng: stored head vectors, task encoding, per-task probing, tables, figures, workflow."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, run_snakemake

from headatlas.core.extract import ExtractSettings, extract
from headatlas.core.store import AttentionStore
from headatlas.jomyaeng.analysis import (
    RESULT_COLUMNS,
    TopNSettings,
    category_scores,
    head_table,
    model_tables,
    probe_task,
    rank_heads,
    summary_table,
    task_correlation,
    task_data,
    top_n_features,
    with_paper,
)
from headatlas.jomyaeng.figures import all_figures, head_matrix, sort_rows
from headatlas.jomyaeng.probes import ProbeConfig

FIGURES = (
    "heatmap_sorted",
    "heatmap_unsorted",
    "heatmap_selectivity",
    "task_correlation",
    "categories",
    "focused",
    "topn_curve",
    "layer_profile",
)


# --- the stored per-head representation ----------------------------------------------------


def _manual_context(model, name, input_ids, position):
    """sum_j A[h, position, j] v_j for every layer and head, from the model's own modules."""
    torch.set_grad_enabled(False)
    out = model(input_ids=torch.as_tensor(input_ids)[None], output_attentions=True, output_hidden_states=True)
    ctx, hidden = [], []
    for layer, attn in enumerate(out.attentions):
        h_in = out.hidden_states[layer]
        if name == "bert":
            v = model.encoder.layer[layer].attention.self.value(h_in)[0]
            H = attn.shape[1]
            v = v.view(v.shape[0], H, -1)
        else:  # llama: pre-norm, grouped value heads
            block = model.layers[layer]
            v = block.self_attn.v_proj(block.input_layernorm(h_in))[0]
            H, kv = attn.shape[1], model.config.num_key_value_heads
            v = v.view(v.shape[0], kv, -1).repeat_interleave(H // kv, dim=1)
        ctx.append(torch.einsum("hj,jhd->hd", attn[0, :, position, :], v).numpy())
        hidden.append(out.hidden_states[layer + 1][0, position].numpy())
    torch.set_grad_enabled(True)
    return np.stack(ctx), np.stack(hidden)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_head_vectors_equal_manual_context_vectors(tmp_path, tiny_loaded, ewt_records, name):
    spec, model, tokenizer, config = tiny_loaded(name)
    records = ewt_records[:6]
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path / "store",
        ExtractSettings(maps=False, reps=True, rep_position="last"),
    )
    with AttentionStore(tmp_path / "store") as store:
        assert store.meta["rep_position"] == ("cls" if name == "bert" else "last")
        heads = np.stack([store.head_vectors(layer) for layer in range(store.n_layers)], 1)  # [N, L, H, d]
        hidden = np.stack([store.hidden(layer) for layer in range(store.n_layers)], 1)
        for k in range(len(store)):
            ids = store.tokens(k)["input_ids"]
            position = 0 if name == "bert" else len(ids) - 1
            ctx, hid = _manual_context(model, name, ids, position)
            np.testing.assert_allclose(heads[k], ctx, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(hidden[k], hid, rtol=1e-4, atol=1e-5)


# --- task encoding and probing on planted features -------------------------------------------


def test_task_data_drops_missing_records_and_encodes_pairs():
    items = pd.DataFrame(
        {"split": ["train", "train", "dev", "test", "test"], "record": ["a", "b", "c", "d", "gone"],
         "label": ["x", "y", "x", "y", "x"], "control": ["y", "y", "x", "x", "x"]}
    )  # fmt: skip
    d = task_data(items, ["d", "c", "b", "a"])
    assert d.dropped == 1 and d.classes == ["x", "y"]
    np.testing.assert_array_equal(d.rows_a, [3, 2, 1, 0])
    np.testing.assert_array_equal(d.y, [0, 1, 0, 1])
    np.testing.assert_array_equal(d.control, [1, 1, 0, 0])
    pairs = pd.DataFrame(
        {
            "split": ["train", "dev", "test"],
            "record_a": ["a", "b", "c"],
            "record_b": ["b", "c", "a"],
            "label": ["1.0", "4.5", "5"],
        }
    )
    r = task_data(pairs, ["a", "b", "c"], kind="relatedness")
    np.testing.assert_array_equal(r.rows_b, [1, 2, 0])
    np.testing.assert_allclose(r.y @ r.values, [1.0, 4.5, 5.0])
    assert r.control is None and r.metric == "pearson"
    with pytest.raises(ValueError, match="no test item"):
        task_data(items, ["a", "b", "c"])


def planted_task(L=3, H=4, d=6, n=(300, 120, 120), layer=1, head=2, seed=0):
    """Head (layer, head) carries a 3-way label; every other head and every layer is noise,
    except the layer above the planted head, whose hidden state carries it weakly."""
    rng = np.random.default_rng(seed)
    N = sum(n)
    split = np.array(["train"] * n[0] + ["dev"] * n[1] + ["test"] * n[2])
    y = rng.integers(0, 3, N)
    heads = rng.normal(size=(L, H, N, d)).astype(np.float32)
    heads[layer, head, np.arange(N), y] += 3.0
    layers = rng.normal(size=(L, N, 8)).astype(np.float32)
    layers[layer + 1, np.arange(N), y] += 1.0
    control = rng.integers(0, 3, N)
    items = pd.DataFrame(
        {"split": split, "record": [f"r{k}" for k in range(N)], "label": y.astype(str), "control": control.astype(str)}
    )
    return heads, layers, task_data(items, list(items["record"]))


def test_probe_task_finds_the_planted_head():
    heads, layers, data = planted_task()
    cfg = ProbeConfig(max_epoch=40)
    res = probe_task(heads, layers, data, cfg, TopNSettings(n_curve=(1, 2, 4, 100)), model="m", task="T")
    assert list(res.columns) == RESULT_COLUMNS
    h = res[res["kind"] == "head"]
    assert len(h) == 12 and len(res[res["kind"] == "layer"]) == 3
    assert sorted(res.loc[res["kind"] == "topn", "n"]) == [1, 2, 4]  # n = 100 > 12 heads dropped; n_top = H = 4
    best = h.iloc[rank_heads(h["dev"].to_numpy())[0]]
    assert (best["layer"], best["head"]) == (1, 2) and best["test"] > 0.95
    assert best["selectivity"] > 0.5  # random control labels stay near chance
    assert h.drop(index=best.name)["test"].max() < 0.6
    summary = summary_table(res, 3, 4)
    row = summary.iloc[0]
    assert row["best_head"] == "2-3" and row["best_layer_dev"] == 2 and row["top_n"] > 0.85
    assert row["best_head_depth"] == 0.5


def test_top_n_features_concatenate_in_rank_order():
    flat = np.arange(3 * 2 * 2).reshape(3, 2, 2)  # [heads, N, d]
    order = rank_heads(np.array([0.1, 0.9, 0.5]))
    np.testing.assert_array_equal(order, [1, 2, 0])
    np.testing.assert_array_equal(top_n_features(flat, order, 2), [[4, 5, 8, 9], [6, 7, 10, 11]])


def _results_frame():
    rows = []
    for task, peak in (("SentLen", 0), ("Tense", 2), ("BigramShift", 1)):
        for layer in range(3):
            for head in range(2):
                acc = 0.5 + 0.1 * (layer == peak) + 0.05 * head
                rows.append(dict(model="m", task=task, kind="head", layer=layer, head=head, n=1, metric="accuracy",
                                 dev=acc, test=acc - 0.01, control_dev=0.3, control_test=0.3, selectivity=acc - 0.31, l2=1e-5, epochs=4, chance=0.5))  # fmt: skip
            rows.append(dict(model="m", task=task, kind="layer", layer=layer, head=-1, n=0, metric="accuracy",
                             dev=[0.6, 0.7, 0.65][layer], test=[0.6, 0.6, 0.8][layer], l2=1e-5, epochs=4, chance=0.5))  # fmt: skip
        for n in (1, 2):
            rows.append(
                dict(
                    model="m",
                    task=task,
                    kind="topn",
                    layer=-1,
                    head=-1,
                    n=n,
                    metric="accuracy",
                    dev=0.8,
                    test=0.75 + 0.01 * n,
                    l2=1e-5,
                    epochs=4,
                    chance=0.5,
                )
            )
    return pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)


def test_summary_best_layer_by_dev_and_by_test():
    s = summary_table(_results_frame(), 3, 2).set_index("task")
    assert s.loc["SentLen", "best_layer_dev"] == 1 and s.loc["SentLen", "best_layer"] == pytest.approx(0.6)
    assert s.loc["SentLen", "best_layer_test"] == 2 and s.loc["SentLen", "best_layer_by_test"] == pytest.approx(0.8)
    assert s.loc["SentLen", "top_n"] == pytest.approx(0.77) and s.loc["SentLen", "n_top"] == 2
    assert s.loc["Tense", "best_head"] == "3-2" and s.loc["Tense", "peak_layer_depth"] == 1.0
    assert s.loc["SentLen", "peak_layer_depth"] == 0.0 and s.loc["BigramShift", "top_heads_depth"] == 0.5


def test_model_tables_split_results_by_kind():
    t = model_tables(_results_frame())
    assert list(t) == ["heads", "layers", "topn", "summary"]
    assert len(t["layers"]) == 3 * 3 and "selectivity" not in t["layers"] and "head" not in t["layers"]
    assert t["topn"]["n"].tolist() == [1, 2] * 3 and "layer" not in t["topn"]
    assert t["summary"].equals(summary_table(_results_frame(), 3, 2))
    one = model_tables(_results_frame(), TopNSettings.from_config({"top_n": 1}))
    assert one["summary"].equals(summary_table(_results_frame(), 3, 2, 1))


def test_top_n_settings_from_config():
    assert TopNSettings.from_config({"top_n": 0, "n_curve": [1, 4]}) == TopNSettings(top_n=None, n_curve=(1, 4))
    assert TopNSettings.from_config({"top_n": 3}).top_n == 3 and TopNSettings.from_config({}) == TopNSettings()
    with pytest.raises(TypeError):
        TopNSettings(3)  # keyword-only
    with pytest.raises(AttributeError):
        TopNSettings().top_n = 2  # frozen


def test_category_scores_correlation_and_paper_table():
    heads = head_table(_results_frame())
    assert list(heads.columns[:8]) == ["model", "layer", "head", "task", "metric", "dev_acc", "test_acc", "control_acc"]
    cats = category_scores(heads).set_index(["layer", "head"])
    assert cats.loc[(0, 0), "surface"] == pytest.approx(0.59)
    assert cats.loc[(1, 1), "syntactic"] == pytest.approx(0.64)
    corr = task_correlation(heads)
    assert corr.loc["SentLen", "SentLen"] == pytest.approx(1.0)
    paper = with_paper(summary_table(_results_frame(), 3, 2))
    sl = paper.set_index("task").loc["SentLen"]
    assert sl["paper_bert_base_top_n"] == 0.95 and sl["top_n"] == pytest.approx(0.77)  # fractions, as ours
    assert sl["paper_bert_base_best_head"] == "0.869 (1-8)"
    assert "TREC (paper only)" in set(paper["task"])


def test_heatmap_sorting_and_figures(tmp_path):
    heads = head_table(_results_frame())
    m = head_matrix(heads, "Tense")
    assert m.shape == (3, 2) and m[2, 1] == pytest.approx(0.64)
    np.testing.assert_array_equal(sort_rows(np.array([[0.1, 0.3, 0.2]])), [[0.3, 0.2, 0.1]])
    res = _results_frame()
    layers = res[res["kind"] == "layer"]
    topn = res[res["kind"] == "topn"]
    out = {f: tmp_path / f"{f}.png" for f in FIGURES} | {f"{f}_svg": tmp_path / f"{f}.svg" for f in FIGURES}
    all_figures(heads, layers, topn, summary_table(res, 3, 2), out, "m", ["SentLen", "BigramShift", "Tense"], [])
    for f in FIGURES:
        assert out[f].stat().st_size > 5000 and b"<svg" in out[f"{f}_svg"].read_bytes(), f


# --- the workflow on a tiny model --------------------------------------------------------------


def _slice_gum(tmp: Path) -> tuple[dict, dict]:
    conllu = (REPO / "resources/gum/ontogum_dev.conllu").read_text(encoding="utf-8")
    blocks = [b for b in conllu.split("\n\n") if b.strip()]
    with gzip.open(REPO / "resources/gum/const_dev.ptb.gz", "rt", encoding="utf-8") as fh:
        trees = [b for b in fh.read().split("\n\n") if b.strip()]
    tb, tr = {}, {}
    for split, lo, hi in (("train", 0, 900), ("dev", 900, 1250), ("test", 1250, len(blocks))):
        tb[split], tr[split] = str(tmp / f"{split}.conllu"), str(tmp / f"{split}.ptb")
        Path(tb[split]).write_text("\n\n".join(blocks[lo:hi]) + "\n\n", encoding="utf-8")
        Path(tr[split]).write_text("\n\n".join(trees[lo:hi]) + "\n", encoding="utf-8")
    return tb, tr


@pytest.mark.slow
def test_workflow_end_to_end(tmp_path, tiny_models):
    tb, tr = _slice_gum(tmp_path)
    sick = REPO / "resources" / "sick"
    config = {
        "models": [{"name": "bert", "source": {"path": str(tiny_models["bert"])}, "max_length": 64, "batch_size": 8}],
        "corpora": {
            "probing": {"kind": "records", "path": "results/probing/sentences.jsonl.gz", "maps": False},
            "downstream": {"kind": "records", "path": "results/probing/downstream_sentences.jsonl.gz", "maps": False},
        },
        "analysis": {
            "jomyaeng": {
                "sources": {"treebanks": {"gum": tb}, "trees": {"gum": tr}},
                "generator": {
                    "sizes": {"train": 60, "dev": 24, "test": 24},
                    "tasks": ["SentLen", "TopConstituents", "OddManOut"],
                    "somo_min_count": 2,
                },
                "downstream": {
                    "SICKR": {
                        "kind": "relatedness",
                        "text_columns": 2,
                        "label_column": 2,
                        "sizes": {"train": 40, "dev": 16, "test": 16},
                        **{s: str(sick / f"sick{s}.tsv") for s in ("train", "dev", "test")},
                    }  # fmt: skip
                },
                "probe": {"max_epoch": 10},
                "n_curve": [1, 2],
            }
        },
    }
    targets = ["results/jomyaeng/summary.tsv", "results/probing/task_stats.tsv", "results/probing/downstream_stats.tsv"]
    targets += [f"results/jomyaeng/bert/{f}.png" for f in FIGURES]
    proc = run_snakemake(tmp_path, config, *targets, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = tmp_path / "results"
    heads = pd.read_csv(res / "jomyaeng/bert/heads.tsv", sep="\t")
    assert len(heads) == 4 * 2 * 4  # 3 probing tasks + SICKR, 2 layers x 4 heads
    assert heads.loc[heads["task"] != "SICKR", "control_acc"].notna().all()
    summary = pd.read_csv(res / "jomyaeng/summary.tsv", sep="\t")
    assert {"SentLen", "SICKR", "SICKE"} <= set(summary["task"])  # SICKE: the paper's row only
    stats = pd.read_csv(res / "probing/task_stats.tsv", sep="\t")
    assert len(stats) == 9 and set(stats["task"]) == {"SentLen", "TopConstituents", "OddManOut"}
    for f in FIGURES:
        assert (res / f"jomyaeng/bert/{f}.png").stat().st_size > 5000
    # a second run has nothing to do
    again = run_snakemake(tmp_path, config, *targets, "-n", timeout=300)
    assert "Nothing to be done" in again.stdout + again.stderr
    # probe_jobs: model (one job for the model's four tasks) writes the same files, byte for byte
    tasks = res / "jomyaeng/bert/tasks"
    per_task = {p.name: p.read_bytes() for p in tasks.glob("*.tsv")}
    assert len(per_task) == 4
    shutil.rmtree(tasks)
    config["analysis"]["jomyaeng"]["probe_jobs"] = "model"
    proc = run_snakemake(tmp_path, config, *targets, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in tasks.glob("*.tsv")} == per_task
    assert (res / "benchmarks/jomyaeng_probe/bert.tsv").exists()  # one job, not four
