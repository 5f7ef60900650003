"""extraction.jobs: model (one extraction job per model, every corpus and shard in turn) writes the same
stores as jobs: corpus (one job per model x corpus x shard); the schema takes only those two values."""

from __future__ import annotations

import shutil

import pytest
from conftest import job_stats, run_snakemake
from tiny_workflow import REPO, compare_results, tiny_config

from integration.test_sharding import ONE_THREAD

CORPORA = ["ewt_dev", "wiki"]  # ewt_dev: gold trees; wiki: a parse, a map sample, clark_surface's reducers only


def test_extraction_jobs_schema():
    from snakemake.utils import validate

    schema = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
    base = {"models": [{"name": "m", "source": {"path": "x"}}], "corpora": {"c": {"kind": "conllu", "path": "c"}}}
    config = dict(base)
    validate(config, schema)
    assert config["extraction"]["jobs"] == "corpus"
    validate(dict(base, extraction={"jobs": "model"}), schema)
    with pytest.raises(Exception, match="jobs|shard"):
        validate(dict(base, extraction={"jobs": "shard"}), schema)


@pytest.mark.slow
def test_model_jobs_write_the_same_stores_as_corpus_jobs(tmp_path, tiny_models):
    models = {"bert": tiny_models["bert"], "gpt2": tiny_models["gpt2"]}
    cfg = tiny_config(models, shards=2, limit=6, analyses=["clark_surface", "pande"], corpora=CORPORA, maps="config")
    assert list(cfg["corpora"]) == CORPORA and "jobs" not in cfg["extraction"]  # the default: corpus
    targets = [f"results/attention/{m}/{c}/shard{i}of2" for m in models for c in CORPORA for i in range(2)]
    work = tmp_path / "work"
    work.mkdir()

    run = run_snakemake(work, cfg, *targets, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-6000:]
    assert job_stats(run.stdout + run.stderr)["extract_attention"] == 8
    per_corpus = tmp_path / "per_corpus"
    shutil.move(work / "results" / "attention", per_corpus)

    cfg["extraction"]["jobs"] = "model"
    run = run_snakemake(work, cfg, *targets, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-6000:]
    stats = job_stats(run.stdout + run.stderr)
    assert {r: n for r, n in stats.items() if r.startswith("extract")} == {
        "extract_attention_bert": 1,
        "extract_attention_gpt2": 1,
    }
    for m in models:
        assert (work / "results" / "benchmarks" / f"extract_attention_{m}.tsv").is_file()
        assert (work / "logs" / "extract_attention" / f"{m}.log").is_file()
    # every store file: HDF5 datasets and attributes bit for bit, manifests and metadata byte for byte
    stores = work / "results" / "attention"
    assert len(list(stores.rglob("reduced/*.h5"))) >= 4 and len(list(stores.rglob("sample/manifest.json"))) >= 4
    problems = compare_results(per_corpus, stores)
    assert problems == [], "\n".join(problems)

    dry = run_snakemake(work, cfg, "--dry-run", *targets, env=ONE_THREAD)
    assert dry.returncode == 0 and not job_stats(dry.stdout), dry.stdout[-3000:]
    # a reducer setting of the second corpus (clark_surface runs on wiki only) reaches the model's job
    cfg["analysis"]["clark_surface"]["smoothing"] = 0.001
    dry = run_snakemake(work, cfg, "--dry-run", *targets, env=ONE_THREAD)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert job_stats(dry.stdout) == {"extract_attention_bert": 1, "extract_attention_gpt2": 1}, dry.stdout[-3000:]
