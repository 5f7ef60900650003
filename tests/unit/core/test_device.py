"""job_device: the device a model-running job uses, from the model's device, the job's gpu resource
and what the scheduler granted (the environment), logged once per job."""

from __future__ import annotations

import logging

import pytest
import torch

from headatlas.core import device as device_mod
from headatlas.core.device import ON_CPU, job_device


@pytest.fixture(autouse=True)
def fresh_log():
    device_mod._said.clear()
    yield
    device_mod._said.clear()


def lines(caplog):
    return [r for r in caplog.records if r.name == "headatlas.device"]


def test_cpu_model_never_uses_a_gpu(caplog):
    caplog.set_level(logging.INFO)
    assert job_device("cpu", gpus=1, env={"CUDA_VISIBLE_DEVICES": "0"}, cuda=True) == "cpu"
    assert [r.levelname for r in lines(caplog)] == ["INFO"]


def test_granted_gpu_is_used_when_cuda_is_there(caplog):
    caplog.set_level(logging.INFO)
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "3"}
    assert job_device("auto", gpus=1, env=env, cuda=True) == "cuda"
    assert job_device("cuda", gpus=1, env=env, cuda=True) == "cuda"
    assert "CUDA_VISIBLE_DEVICES='3'" in lines(caplog)[0].getMessage()


def test_slurm_job_that_asked_for_no_gpu_uses_none_even_if_one_is_visible(caplog):
    # a node without device cgroups shows its GPUs to every job: only a granted one may be used
    caplog.set_level(logging.INFO)
    env = {"SLURM_JOB_ID": "8", "CUDA_VISIBLE_DEVICES": "0"}
    assert job_device("auto", gpus=0, env=env, cuda=True) == "cpu"
    assert "SLURM job 8 asked the scheduler for no GPU" in lines(caplog)[0].getMessage()
    # outside a scheduler (a workstation), auto takes a visible GPU whatever the resource says
    assert job_device("auto", gpus=0, env={}, cuda=True) == "cuda"


def test_gpu_job_without_cuda_runs_on_the_cpu_and_says_so_once(caplog):
    caplog.set_level(logging.INFO)
    env = {"SLURM_JOB_ID": "9"}
    assert job_device("auto", gpus=1, env=env, cuda=False) == "cpu"
    assert job_device("auto", gpus=1, env=env, cuda=False) == "cpu"  # a second call: no second line
    (rec,) = lines(caplog)
    msg = rec.getMessage()
    assert rec.levelname == "WARNING"
    assert "SLURM job 9 asked for 1 GPU and was granted, but CUDA is not available" in msg
    assert "CUDA_VISIBLE_DEVICES unset" in msg and msg.endswith(ON_CPU)
    assert f"torch {torch.__version__}" in msg


def test_cuda_model_without_cuda_falls_back_with_a_warning(caplog):
    caplog.set_level(logging.INFO)
    assert job_device("cuda", gpus=None, env={"CUDA_VISIBLE_DEVICES": ""}, cuda=False) == "cpu"
    (rec,) = lines(caplog)
    assert rec.levelname == "WARNING" and "CUDA_VISIBLE_DEVICES=''" in rec.getMessage()
    assert rec.getMessage().endswith(ON_CPU)


def test_auto_without_a_gpu_job_is_a_plain_cpu_run(caplog):
    caplog.set_level(logging.INFO)
    assert job_device("auto", gpus=0, env={}, cuda=False) == "cpu"
    (rec,) = lines(caplog)
    assert rec.levelname == "INFO" and ON_CPU not in rec.getMessage()


def test_unknown_device_is_an_error():
    with pytest.raises(ValueError, match="'tpu'"):
        job_device("tpu")


def test_load_puts_the_model_on_the_job_device(tiny_models, monkeypatch, caplog):
    """models.load without a device uses job_device: a GPU job on a machine without CUDA loads on the CPU."""
    from conftest import tiny_spec

    from headatlas.core.models import load

    caplog.set_level(logging.INFO)
    monkeypatch.setenv("SLURM_JOB_ID", "10")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, _, _ = load(tiny_spec("bert", tiny_models["bert"], device="cuda"))
    assert next(model.parameters()).device.type == "cpu"
    assert any(ON_CPU in r.getMessage() for r in lines(caplog))


@pytest.mark.cuda
def test_granted_gpu_is_the_job_device_on_cuda(tiny_models, monkeypatch):
    """On a CUDA machine: a SLURM GPU job's model loads on the GPU; one that asked for none stays on the CPU."""
    from conftest import tiny_spec

    from headatlas.core.models import load

    monkeypatch.setenv("SLURM_JOB_ID", "11")
    assert job_device("auto", gpus=1) == "cuda"
    assert job_device("auto", gpus=0) == "cpu"
    model, _, _ = load(tiny_spec("bert", tiny_models["bert"]), device=job_device("auto", gpus=1))
    assert next(model.parameters()).device.type == "cuda"


@pytest.mark.cuda
def test_finetune_on_cuda(tmp_path, tiny_models):
    from conftest import tiny_spec

    from headatlas.core.finetune import finetune
    from unit.core.test_finetune import SST2_TRAIN, head_lines

    train = head_lines(SST2_TRAIN, tmp_path / "train.tsv", 64)
    task = {"name": "toy", "train": str(train), "dev": str(train), "text_columns": 1, "label_column": 1,
            "steps": 4, "batch_size": 8, "max_length": 32, "lr": 1e-3, "seed": 0}  # fmt: skip
    metrics = finetune(tiny_spec("bert", tiny_models["bert"]), None, task, str(tmp_path / "ft"), device="cuda")
    assert 0 <= metrics["dev_accuracy"] <= 1 and (tmp_path / "ft" / "config.json").is_file()
