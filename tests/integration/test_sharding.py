"""A corpus split into N shards gives the same analysis results as one shard.

Extraction writes results/attention/{model}/{corpus}/shard{i}of{n}; every analysis that reads
maps or representations gathers all shards of a (model, corpus) into one AttentionStore. The
end-to-end test runs the real workflow on a tiny BERT with 1 shard and with 2 uneven shards and
compares the outputs of every job that reads all shards of a corpus (TSV bit for bit, HDF5
dataset by dataset). Everything downstream of those jobs reads their outputs and at most the
model's shape from one shard, so it is equal too.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_snakemake
from tiny_workflow import REPO, compare_results, tiny_config

N_SHARDS = 2
LIMIT = 9  # records per corpus: shards of 5 and 4
# The analyses of the default config run here, those whose
# jobs read the shards in seconds on a tiny model. Left out: jomyaeng (its probing corpora are
# generated, 1500 sentences, and its probes trained per head and task) and clark_syntax (its
# probe trains on EWT train): minutes, not seconds.
SECTIONS = ("clark_surface", "pande")
# one corpus for all of them (gold trees: no parse job)
CORPUS = "ewt_dev"


ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # one OpenMP thread per job: the runs are compared bit for bit


def gather_jobs(dry_run_stdout: str, n_shards: int) -> tuple[set[str], list[str]]:
    """(rules, outputs) of the jobs of a dry run that read all ``n_shards`` shards of a corpus."""
    rules, outputs = set(), []
    rule, inputs = None, ""
    for line in dry_run_stdout.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):\s*$", line)
        if m:
            rule, inputs = m.group(1), ""
            continue
        m = re.match(r"^\s+(input|output): (.*)$", line)
        if m and rule:
            if m.group(1) == "input":
                inputs = m.group(2)
                continue
            shards: dict[str, set[int]] = {}
            for d, i in re.findall(rf"(results/attention/[^,]*?)/shard(\d+)of{n_shards}\b", inputs):
                shards.setdefault(d, set()).add(int(i))
            if any(found == set(range(n_shards)) for found in shards.values()):
                rules.add(rule)
                outputs += [p.strip() for p in m.group(2).split(",")]
    return rules, outputs


def sharding_config(model_dirs: dict, shards: int) -> dict:
    """The tiny config with the SECTIONS of the default config, all on CORPUS only."""
    with open(REPO / "config" / "config.yaml", encoding="utf-8") as fh:
        sections = [k for k in yaml.safe_load(fh).get("analysis", {}) if k in SECTIONS]
    cfg = tiny_config(model_dirs, shards=shards, limit=LIMIT, analyses=sections)
    for section in cfg["analysis"].values():
        if isinstance(section.get("corpora"), list):
            section["corpora"] = [CORPUS]
    cfg["corpora"] = {CORPUS: cfg["corpora"][CORPUS]}
    return cfg


def test_gather_jobs_parses_dry_run_blocks():
    text = """
rule extract_attention:
    input: results/corpora/wiki.jsonl.gz
    output: results/attention/bert/wiki/shard1of3
    wildcards: model=bert
rule clark_surface_stats:
    input: results/attention/bert/wiki/shard0of3, results/attention/bert/wiki/shard1of3, results/attention/bert/wiki/shard2of3
    output: results/clark/bert/wiki/surface.tsv
rule clark_behaviour:
    input: results/clark/bert/wiki/surface.tsv
    output: results/clark/bert/wiki/behaviour.tsv
rule atlas:
    input: results/clark/bert/wiki/behaviour.tsv, results/attention/bert/wiki/shard0of3
    output: results/atlas/bert/atlas.tsv
localrule pande_scores:
    input: results/attention/bert/ewt/shard0of3, results/attention/bert/ewt/shard1of3, results/attention/bert/ewt/shard2of3, results/corpora/ewt.jsonl.gz
    output: results/pande/bert/scores/ewt.h5, results/pande/bert/x.tsv
"""
    rules, outputs = gather_jobs(text, 3)
    assert rules == {"clark_surface_stats", "pande_scores"}
    assert outputs == [
        "results/clark/bert/wiki/surface.tsv",
        "results/pande/bert/scores/ewt.h5",
        "results/pande/bert/x.tsv",
    ]
    assert gather_jobs(text, 2) == (set(), [])


def test_sharding_config_splits_one_corpus(tmp_path):
    cfg = sharding_config({"bert": tmp_path}, N_SHARDS)
    assert cfg["extraction"]["shards"] == N_SHARDS
    assert list(cfg["corpora"]) == [CORPUS]
    assert "shards" not in cfg["corpora"][CORPUS] and cfg["corpora"][CORPUS]["limit"] == LIMIT
    assert set(cfg["analysis"]) <= set(SECTIONS)
    assert all(s.get("corpora", [CORPUS]) == [CORPUS] for s in cfg["analysis"].values())


def test_compare_results_finds_every_kind_of_difference(tmp_path):
    import h5py
    import numpy as np

    a, b = tmp_path / "a", tmp_path / "b"
    for root, value, figure in ((a, 1.0, b"png one"), (b, 1.0, b"png two")):
        (root / "x").mkdir(parents=True)
        (root / "x" / "t.tsv").write_text("head\tscore\n0\t0.5\n")
        (root / "x" / "fig.png").write_bytes(figure)
        (root / "attention").mkdir()
        (root / "attention" / "skip.tsv").write_text(str(root))
        with h5py.File(root / "x" / "s.h5", "w") as f:
            f.create_dataset("scores", data=np.array([0.25, value]))
            f.attrs["n"] = 2
    assert compare_results(a, b, exclude=("attention",)) == []  # figures: existence only
    assert compare_results(a, b) == ["attention/skip.tsv: contents differ"]

    (b / "x" / "t.tsv").write_text("head\tscore\n0\t0.50001\n")
    with h5py.File(b / "x" / "s.h5", "a") as f:
        f["scores"][1] = np.nextafter(1.0, 2.0)
    (b / "x" / "extra.tsv").write_text("")
    assert compare_results(a, b, exclude=("attention",)) == [
        f"only in {b}: x/extra.tsv",
        "x/s.h5: HDF5 dataset scores differs",
        "x/t.tsv: contents differ",
    ]
    with h5py.File(b / "x" / "s.h5", "a") as f:
        f["scores"][1] = 1.0
        f.attrs["n"] = 3
    assert "x/s.h5: HDF5 attributes of / differ" in compare_results(a, b, exclude=("attention",))


@pytest.mark.slow
def test_one_shard_and_n_shards_give_identical_results(tmp_path, tiny_models):
    models = {"bert": tiny_models["bert"]}
    work = tmp_path / "work"
    work.mkdir()

    one, many = sharding_config(models, 1), sharding_config(models, N_SHARDS)
    dry = run_snakemake(work, many, "--dry-run", env=ONE_THREAD)
    assert dry.returncode == 0, dry.stderr[-4000:]
    rules, targets = gather_jobs(dry.stdout, N_SHARDS)
    assert "clark_surface_stats" in rules and targets, dry.stdout[-4000:]

    run = run_snakemake(work, one, *targets, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-6000:]
    single = tmp_path / "one_shard"
    shutil.copytree(work / "results", single, ignore=shutil.ignore_patterns("attention"))

    # the same workdir: corpora and parses are reused, the gather jobs rerun on N_SHARDS shards
    run = run_snakemake(work, many, "--forcerun", *sorted(rules), "--", *targets, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr[-6000:]
    for corpus in many["corpora"]:
        shards = sorted(
            p.name
            for p in (work / "results" / "attention" / "bert" / corpus).iterdir()
            if p.name.endswith(f"of{N_SHARDS}")
        )
        assert shards == [f"shard{i}of{N_SHARDS}" for i in range(N_SHARDS)]
    for rule in rules:
        # snakemake's job block (rule X:) or the terminal's one line per job ([time] rule X (...): jobid N)
        assert re.search(rf"^(\[[\d:]+\] )?(local)?rule {rule}\b", run.stdout + run.stderr, re.M), (
            f"{rule} did not rerun on {N_SHARDS} shards"
        )

    compared = [t for t in targets if (single / Path(t).relative_to("results")).is_file()]
    assert any(t.endswith(".tsv") for t in compared), targets
    problems = compare_results(single, work / "results", exclude=("attention",))
    assert problems == [], "\n".join(problems)
