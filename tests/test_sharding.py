"""A corpus split into N shards gives the same analysis results as one shard.

Extraction writes results/attention/{model}/{corpus}/shard{i}of{n}; every analysis that reads
maps or representations gathers all shards of a (model, corpus) into one AttentionStore. The
end-to-end test runs the real workflow on a tiny BERT with 1 shard and with 3 uneven shards and
compares the outputs of every job that reads the shards (TSV bit for bit, HDF5 dataset by
dataset). Everything downstream of those jobs reads only their outputs, so it is equal too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_workflow import REPO, compare_results, tiny_config

N_SHARDS = 3
LIMIT = 10  # records per corpus: shards of 4, 3 and 3
# The analyses of the default config run here (each on the first of its corpora), those whose
# jobs read the shards in seconds on a tiny model. Left out: jomyaeng (its probing corpora are
# generated, 1500 sentences, and its probes trained per head and task) and clark_syntax (its
# probe trains on EWT train): minutes, not seconds.
SECTIONS = ("clark_surface", "pande")


def snakemake(workdir: Path, config: dict, *args: str) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--configfile", str(cfg), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=workdir)


def gather_jobs(dry_run_stdout: str) -> tuple[set[str], list[str]]:
    """(rules, outputs) of the jobs of a dry run whose input includes stored attention shards."""
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
            elif re.search(r"results/attention/[^,]*/shard\d+of\d+", inputs):
                rules.add(rule)
                outputs += [p.strip() for p in m.group(2).split(",")]
    return rules, outputs


def sharding_config(model_dirs: dict, shards: int) -> dict:
    """The tiny config with the SECTIONS of the default config, each on its first corpus only."""
    with open(REPO / "config" / "config.yaml", encoding="utf-8") as fh:
        sections = [k for k in yaml.safe_load(fh).get("analysis", {}) if k in SECTIONS]
    cfg = tiny_config(model_dirs, shards=shards, limit=LIMIT, analyses=sections)
    for section in cfg["analysis"].values():
        if isinstance(section.get("corpora"), list) and section["corpora"]:
            section["corpora"] = section["corpora"][:1]
    named = {c for s in cfg["analysis"].values() for c in s.get("corpora", [])}
    cfg["corpora"] = {k: v for k, v in cfg["corpora"].items() if k in named} or cfg["corpora"]
    return cfg


def test_gather_jobs_parses_dry_run_blocks():
    text = """
rule extract_attention:
    input: results/corpora/wiki.jsonl.gz
    output: results/attention/bert/wiki/shard1of3
    wildcards: model=bert
rule clark_surface_stats:
    input: results/attention/bert/wiki/shard0of3, results/attention/bert/wiki/shard1of3
    output: results/clark/bert/wiki/surface.tsv
rule clark_behaviour:
    input: results/clark/bert/wiki/surface.tsv
    output: results/clark/bert/wiki/behaviour.tsv
localrule pande_scores:
    input: results/corpora/ewt.jsonl.gz, results/attention/bert/ewt/shard0of1
    output: results/pande/bert/scores/ewt.h5, results/pande/bert/x.tsv
"""
    rules, outputs = gather_jobs(text)
    assert rules == {"clark_surface_stats", "pande_scores"}
    assert outputs == ["results/clark/bert/wiki/surface.tsv", "results/pande/bert/scores/ewt.h5", "results/pande/bert/x.tsv"]


def test_sharding_config_splits_every_kept_corpus(tmp_path):
    cfg = sharding_config({"bert": tmp_path}, N_SHARDS)
    assert cfg["extraction"]["shards"] == N_SHARDS
    assert all("shards" not in c and c["limit"] == LIMIT for c in cfg["corpora"].values())
    assert set(cfg["analysis"]) <= set(SECTIONS)
    assert all(len(s.get("corpora", [])) <= 1 for s in cfg["analysis"].values())


@pytest.mark.slow
def test_one_shard_and_n_shards_give_identical_results(tmp_path, tiny_models):
    models = {"bert": tiny_models["bert"]}
    work = tmp_path / "work"
    work.mkdir()

    one = sharding_config(models, 1)
    dry = snakemake(work, one, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-4000:]
    rules, targets = gather_jobs(dry.stdout)
    assert "clark_surface_stats" in rules and targets, dry.stdout[-4000:]

    run = snakemake(work, one, *targets)
    assert run.returncode == 0, run.stderr[-6000:]
    single = tmp_path / "one_shard"
    shutil.copytree(work / "results", single, ignore=shutil.ignore_patterns("attention"))

    # the same workdir: corpora and parses are reused, the gather jobs rerun on 3 shards
    many = sharding_config(models, N_SHARDS)
    run = snakemake(work, many, "--forcerun", *sorted(rules), "--", *targets)
    assert run.returncode == 0, run.stderr[-6000:]
    for corpus in many["corpora"]:
        shards = sorted(p.name for p in (work / "results" / "attention" / "bert" / corpus).iterdir() if p.name.endswith(f"of{N_SHARDS}"))
        assert shards == [f"shard{i}of{N_SHARDS}" for i in range(N_SHARDS)]
    for rule in rules:
        assert re.search(rf"^(local)?rule {rule}:", run.stdout + run.stderr, re.M), f"{rule} did not rerun on {N_SHARDS} shards"

    compared = [t for t in targets if (single / Path(t).relative_to("results")).is_file()]
    assert any(t.endswith(".tsv") for t in compared), targets
    problems = compare_results(single, work / "results", exclude=("attention",))
    assert problems == [], "\n".join(problems)
