"""The Snakemake profiles: what they set, and how a rule's resources become a SLURM request.

The cluster run itself is exercised on a real single-node SLURM by .ci/slurm/run.sh (CI); these
tests pin the pieces that do not need one: the profile keys, the gpu resource per model device
(and the GPU profile's switch), and what the executor plugin turns those resources into.
"""

from __future__ import annotations

import logging

import pytest
import yaml
from conftest import dry_run
from tiny_workflow import REPO

PROFILES = REPO / "profiles"


class Resources(dict):
    """A job's resources as the plugin reads them: .get() and attribute access."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


class FakeJob:
    def __init__(self, name="extract_attention", threads=1, **resources):
        self.name = name
        self.threads = threads
        self.resources = Resources(resources)


def load(name: str) -> dict:
    with open(PROFILES / name / "config.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_default_profile_holds_only_settings_every_run_can_share():
    # Snakemake reads profiles/default on every run and it overrides --profile key by key.
    default, slurm = load("default"), load("slurm")
    assert default["rerun-incomplete"] is True
    assert default["scheduler"] == "greedy"  # no ILP solver process after every finished job
    assert not {"executor", "resources", "default-resources", "set-resources", "jobs"} & set(default)
    shared = set(default) & set(slurm)
    assert all(default[k] == slurm[k] for k in shared), shared


@pytest.mark.parametrize("name", ["slurm", "slurm-gpu"])
def test_slurm_profile_works_without_accounting(name):
    slurm = load(name)
    assert slurm["executor"] == "slurm"
    assert slurm["slurm-status-command"] == "squeue"
    # the plugin falls back to sacct unless MinJobAge >= 3 x this; the CI cluster has 600 s
    assert 3 * slurm["slurm-init-seconds-before-status-checks"] <= 300
    assert "slurm_account" not in slurm.get("default-resources", {})
    for rule, res in slurm.get("set-resources", {}).items():
        assert "gpu" not in res, f"{rule}: gpu comes from the model's device, per job"
        assert "slurm_account" not in res


def test_slurm_profile_rules_exist():
    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    for name in ("slurm", "slurm-gpu"):
        for rule in load(name).get("set-resources", {}):
            assert f"rule {rule}:" in rules, (name, rule)


GPU_KEYS = {"config", "slurm-partition-config"}


def test_gpu_profile_is_the_slurm_profile_plus_the_gpu_switch():
    slurm, gpu = load("slurm"), load("slurm-gpu")
    assert {k: v for k, v in gpu.items() if k not in GPU_KEYS} == slurm
    # Snakemake reads True (not true) from --config as a boolean; the schema wants one
    assert gpu["config"] == ["gpu_jobs=True"]
    assert (PROFILES / "slurm-gpu" / gpu["slurm-partition-config"]).is_file()


def test_gpu_profile_partition_file_separates_gpu_and_cpu_jobs():
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    parts = read_partition_file(PROFILES / "slurm-gpu" / load("slurm-gpu")["slurm-partition-config"])
    log = logging.getLogger("test")
    assert get_best_partition(parts, FakeJob(gpu=1, mem_mb=8000, runtime=120), log) == "gpu"
    assert get_best_partition(parts, FakeJob(gpu=1, gpu_model="h200", mem_mb=8000, runtime=120), log) == "gpu"
    assert get_best_partition(parts, FakeJob(gpu=0, mem_mb=8000, runtime=120), log) == "cpu"
    assert get_best_partition(parts, FakeJob(name="atlas", mem_mb=2000, runtime=10), log) == "cpu"


def test_gpu_resource_becomes_gpus_request_only_when_nonzero():
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    def sbatch(job):  # as the plugin composes it (run_job)
        params = {
            "run_uuid": "u",
            "slurm_logfile": "l",
            "comment_str": "c",
            "account": "",
            "partition": "",
            "workdir": "/w",
        }
        return get_submit_command(job, params) + set_gres_string(job)

    gpu = sbatch(FakeJob(threads=2, gpu=1, mem_mb=8000, runtime=120))
    cpu = sbatch(FakeJob(threads=2, gpu=0, mem_mb=8000, runtime=120))
    pinned = sbatch(FakeJob(threads=2, gpu=1, gpu_model="a100", mem_mb=8000, runtime=120))
    assert "--gpus=1" in gpu and "--mem 8000" in gpu and "-t 120" in gpu
    assert "--gpus" not in cpu and "--cpus-per-task=2" in cpu and "--mem 8000" in cpu
    assert "--gpus=a100:1" in pinned


def test_partition_file_sends_gpu_jobs_to_gpu_partition():
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    parts = read_partition_file(PROFILES / "slurm" / "partitions.yaml")
    log = logging.getLogger("test")
    assert get_best_partition(parts, FakeJob(gpu=1, mem_mb=8000, runtime=120), log) == "gpu"
    assert get_best_partition(parts, FakeJob(gpu=0, mem_mb=8000, runtime=120), log) == "standard"
    assert get_best_partition(parts, FakeJob(gpu=0, mem_mb=2000, runtime=5), log) == "standard"


def dry_run_gpu(tmp_path, *extra, models: list | None = None) -> dict[str, set]:
    """model -> the gpu resources of its extraction jobs in a dry run of a three-model config (``models``: entries
    of the three names instead of these)."""
    cfg = {
        "models": models
        or [
            {"name": "gpu_model", "source": {"path": str(tmp_path / "a")}, "device": "cuda"},
            {"name": "cpu_model", "source": {"path": str(tmp_path / "b")}, "device": "cpu"},
            {"name": "auto_model", "source": {"path": str(tmp_path / "c")}},
        ],
        "corpora": {
            "ewt": {
                "kind": "conllu",
                "path": str(REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"),
                "shards": 2,
            }
        },
    }
    for d in ("a", "b", "c"):  # model directories are checked when the workflow is parsed
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text('{"model_type": "bert"}')
    targets = [
        f"results/attention/{m}/ewt/shard{i}of2" for m in ("gpu_model", "cpu_model", "auto_model") for i in range(2)
    ]
    _, _, text = dry_run(tmp_path, cfg, *targets, *extra, timeout=300)  # extra last: --config takes every word after it
    gpu = {}
    model = None
    for line in text.splitlines():
        if line.strip().startswith("wildcards:"):
            model = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].strip().split(", ")).get("model")
        if line.strip().startswith("resources:") and model:
            gpu.setdefault(model, set()).add(
                dict(kv.split("=", 1) for kv in line.split(":", 1)[1].strip().split(", ")).get("gpu")
            )
    return gpu


def test_model_device_sets_the_gpu_resource_of_its_jobs(tmp_path):
    """A dry run: the CUDA model's extraction jobs declare gpu=1, the CPU and auto models' gpu=0."""
    assert dry_run_gpu(tmp_path) == {"gpu_model": {"1"}, "cpu_model": {"0"}, "auto_model": {"0"}}


def test_gpu_switch_makes_auto_models_ask_for_a_gpu(tmp_path):
    """With gpu_jobs (what profiles/slurm-gpu sets) the auto model's jobs ask for a GPU too; cpu never."""
    got = dry_run_gpu(tmp_path, "--config", *load("slurm-gpu")["config"])
    assert got == {"gpu_model": {"1"}, "cpu_model": {"0"}, "auto_model": {"1"}}
