"""The Snakemake workflow on tiny models: DAG, end-to-end run, reruns, config and corpus errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EWT_DEV, REPO, WIKI_TEST, dry_run, output_of, run_snakemake

# The surface-statistics step: (rule, config section under analysis, output pattern). The
# workflow is moving from a `surface` section to a `clark_surface` one; test whichever is there.
if (REPO / "workflow" / "rules" / "surface.smk").exists():
    SURFACE_RULE, SURFACE_SECTION, SURFACE_OUT = "surface_stats", "surface", "results/surface/{model}/{corpus}.tsv"
else:
    SURFACE_RULE, SURFACE_SECTION, SURFACE_OUT = (
        "clark_surface_stats",
        "clark_surface",
        "results/clark/{model}/{corpus}/surface.tsv",
    )


def targets(models=("bert", "gpt2"), corpora=("ewt", "wiki"), surface_corpora=("wiki",)) -> list[str]:
    """The extraction directories and surface tables (and nothing the workflow adds later)."""
    out = [f"results/attention/{m}/{c}/shard0of1" for m in models for c in corpora]
    return out + [SURFACE_OUT.format(model=m, corpus=c) for m in models for c in surface_corpora]


def model_entry(name: str, directory: Path) -> dict:
    return {"name": name, "source": {"path": str(directory)}, "max_length": 64, "batch_size": 4}


def tiny_config(tiny_models, models=("bert", "gpt2")) -> dict:
    return {
        "models": [model_entry(m, tiny_models[m]) for m in models],
        "corpora": {
            "ewt": {"kind": "conllu", "path": str(EWT_DEV), "limit": 20},
            "wiki": {
                "kind": "wikitext",
                "path": str(WIKI_TEST),
                "n_segments": 5,
                "max_words": 40,
                "seed": 0,
                "overflow": "truncate",
            },
        },
        "analysis": {SURFACE_SECTION: {"corpora": ["wiki"]}},
    }


def wildcard_set(jobs, rule, *keys):
    return {tuple(w[k] for k in keys) for r, w in jobs if r == rule}


# --- dry runs ---------------------------------------------------------------------------------


def test_dry_run_lists_expected_jobs(tmp_path, tiny_models):
    stats, jobs, _ = dry_run(tmp_path, tiny_config(tiny_models), *targets())
    assert stats == {"prepare_corpus": 2, "extract_attention": 4, SURFACE_RULE: 2}
    assert wildcard_set(jobs, "prepare_corpus", "corpus") == {("ewt",), ("wiki",)}
    assert wildcard_set(jobs, "extract_attention", "model", "corpus", "shard", "nshards") == {
        ("bert", "ewt", "0", "1"),
        ("bert", "wiki", "0", "1"),
        ("gpt2", "ewt", "0", "1"),
        ("gpt2", "wiki", "0", "1"),
    }
    assert wildcard_set(jobs, SURFACE_RULE, "model", "corpus") == {("bert", "wiki"), ("gpt2", "wiki")}
    assert not (tmp_path / "results").exists()


def test_dry_run_shards(tmp_path, tiny_models):
    cfg = tiny_config(tiny_models)
    cfg["corpora"]["ewt"]["shards"] = 3
    stats, jobs, _ = dry_run(tmp_path, cfg)  # the default target: every extraction
    assert stats["extract_attention"] == 2 * (3 + 1)
    assert wildcard_set(jobs, "extract_attention", "corpus", "shard", "nshards") == {
        ("ewt", "0", "3"), ("ewt", "1", "3"), ("ewt", "2", "3"), ("wiki", "0", "1")
    }  # fmt: skip


@pytest.mark.parametrize(
    "breakage, needle",
    [
        ("model without source", "'source' is a required property"),
        ("unknown model key", "config key models[gpt2].colour: unknown key"),
        ("unknown corpus key", "config key corpora.ewt.lmit: unknown key; did you mean limit?"),
        ("wikitext without seed", "'seed' is a required property"),
        ("surface on an unknown corpus", "nosuchcorpus"),
    ],
)
def test_invalid_config_fails_naming_the_key(tmp_path, tiny_models, breakage, needle):
    cfg = tiny_config(tiny_models)
    if breakage == "model without source":
        del cfg["models"][0]["source"]
    elif breakage == "unknown model key":
        cfg["models"][1]["colour"] = "red"
    elif breakage == "unknown corpus key":
        cfg["corpora"]["ewt"]["lmit"] = 20
    elif breakage == "wikitext without seed":
        del cfg["corpora"]["wiki"]["seed"]
    else:
        cfg["analysis"][SURFACE_SECTION]["corpora"] = ["nosuchcorpus"]
    proc = run_snakemake(tmp_path, cfg, "--dry-run")
    text = output_of(proc)
    assert proc.returncode != 0, text[-3000:]
    assert needle in text, text[-3000:]
    assert not (tmp_path / "results").exists()


# --- end-to-end run -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, tiny_models):
    """One real run of the workflow on the tiny BERT and GPT-2 (shared by the rerun tests)."""
    workdir = tmp_path_factory.mktemp("e2e")
    cfg = tiny_config(tiny_models)
    proc = run_snakemake(workdir, cfg, *targets())
    return workdir, cfg, proc


@pytest.mark.slow
def test_end_to_end_outputs(e2e):
    import pandas as pd

    from headatlas.clark.surface import STATS
    from headatlas.core.store import AttentionStore

    workdir, cfg, proc = e2e
    assert proc.returncode == 0, output_of(proc)[-6000:]
    results = workdir / "results"
    assert sorted(p.name for p in (results / "corpora").iterdir()) == [
        "ewt.jsonl.gz", "ewt.jsonl.gz.sha256", "wiki.jsonl.gz", "wiki.jsonl.gz.sha256"
    ]  # each with its seal (docs/integrity.md)  # fmt: skip
    for model in ("bert", "gpt2"):
        for corpus in ("ewt", "wiki"):
            d = results / "attention" / model / corpus / "shard0of1"
            for f in ("tokens.h5", "layer_00.h5", "layer_01.h5", "meta.json"):
                assert (d / f).is_file(), d / f
            assert not (d / "layer_02.h5").exists()
            with AttentionStore(d) as st:
                assert (st.n_layers, st.n_heads) == (2, 4)
                assert st.meta["model"] == model and st.meta["corpus"] == corpus
                assert st.meta["model_kind"] == ("decoder" if model == "gpt2" else "encoder")
                expected = 20 if corpus == "ewt" else 5
                assert st.meta["counts"]["records"] == expected
                assert len(st) + st.meta["counts"].get("skipped_too_long", 0) == expected
                assert st.lengths.max() <= 64
                for m in st.layer_maps(1):
                    assert abs(m.sum(-1) - 1).max() < 1e-5
        table = pd.read_csv(workdir / SURFACE_OUT.format(model=model, corpus="wiki"), sep="\t")
        assert len(table) == 2 * 4
        assert set(STATS) <= set(table.columns)
        assert (table["model"] == model).all() and (table["n_sequences"] == 5).all()
        assert sorted(zip(table["layer"], table["head"])) == [(l, h) for l in range(2) for h in range(4)]
        assert table["entropy"].notna().all()
    assert not (workdir / SURFACE_OUT.format(model="bert", corpus="ewt")).exists()  # surface only on wiki
    leftovers = [p for p in results.rglob("*") if ".tmp" in p.name]
    assert leftovers == []


@pytest.mark.slow
def test_rerun_nothing_to_do(e2e):
    workdir, cfg, proc = e2e
    assert proc.returncode == 0
    stats, jobs, _ = dry_run(workdir, cfg, *targets())
    assert stats == {} and jobs == []


@pytest.mark.slow
def test_adding_a_model_schedules_only_its_jobs(e2e, tiny_models):
    workdir, cfg, proc = e2e
    assert proc.returncode == 0
    cfg3 = dict(cfg, models=cfg["models"] + [model_entry("electra", tiny_models["electra"])])
    stats, jobs, text = dry_run(workdir, cfg3, *targets(("bert", "gpt2", "electra")))
    assert stats == {"extract_attention": 2, SURFACE_RULE: 1}, text[-4000:]
    for rule, wc in jobs:
        assert wc["model"] == "electra", (rule, wc)
    assert wildcard_set(jobs, "extract_attention", "model", "corpus") == {("electra", "ewt"), ("electra", "wiki")}
    assert wildcard_set(jobs, SURFACE_RULE, "model", "corpus") == {("electra", "wiki")}


@pytest.mark.slow
def test_changing_smoothing_reruns_only_surface(e2e):
    workdir, cfg, proc = e2e
    assert proc.returncode == 0
    changed = dict(cfg, analysis={SURFACE_SECTION: {"corpora": ["wiki"], "smoothing": 0.001}})
    stats, jobs, text = dry_run(workdir, changed, *targets())
    assert stats == {SURFACE_RULE: 2}, text[-4000:]
    assert wildcard_set(jobs, SURFACE_RULE, "model", "corpus") == {("bert", "wiki"), ("gpt2", "wiki")}


# --- a corpus error ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_malformed_conllu_fails_with_file_and_line(tmp_path, tiny_models):
    bad = tmp_path / "bad.conllu"
    good = "\t".join(["1", "Hello", "hello", "INTJ", "UH", "_", "0", "root", "_", "_"])
    broken = "\t".join(["2", "world", "world", "NOUN", "NN", "_", "1"])  # line 4: 7 columns
    bad.write_text(f"# sent_id = s1\n# text = Hello world\n{good}\n{broken}\n\n", encoding="utf-8")
    cfg = {
        "models": [model_entry("bert", tiny_models["bert"])],
        "corpora": {"bad": {"kind": "conllu", "path": str(bad)}},
    }
    proc = run_snakemake(tmp_path, cfg, "results/attention/bert/bad/shard0of1")
    text = output_of(proc)
    assert proc.returncode != 0, text[-4000:]
    log = tmp_path / "logs" / "prepare_corpus" / "bad.log"
    assert log.is_file(), text[-4000:]
    assert f"{bad}:4" in log.read_text(encoding="utf-8")
    corpora = tmp_path / "results" / "corpora"
    assert not corpora.exists() or list(corpora.iterdir()) == []
    assert not (tmp_path / "results" / "attention").exists()
