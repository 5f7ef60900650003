"""The device a model-running job uses: the GPU the scheduler granted it, else the CPU.

No job names a GPU itself. The scheduler decides which GPUs a job sees (SLURM with GPUs as generic
resources sets ``CUDA_VISIBLE_DEVICES`` to the granted ones; so does a user on a workstation), and torch
numbers the visible GPUs from 0, so ``cuda`` is the first granted one. :func:`job_device` is the one place
that turns a model's ``device`` setting and the job's ``gpu`` resource into a torch device; every
model-running rule script calls it once and passes the result on. It logs its choice once per job, with
the reason; a job that asked for a GPU and runs where CUDA is unavailable runs on the CPU and says so.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

log = logging.getLogger("headatlas.device")

DEVICES = ("auto", "cpu", "cuda")
# phrase of the log line of a GPU job that runs on the CPU (the SLURM CI greps for it)
ON_CPU = "running on the CPU"
_said: set[str] = set()


def _say(device: str, why: str, warn: bool = False) -> str:
    line = f"device {device}: {why}"
    if line not in _said:
        _said.add(line)
        (log.warning if warn else log.info)(line)
    return device


def job_device(
    requested: str = "auto", gpus: int | None = None, env: Mapping[str, str] | None = None, cuda: bool | None = None
) -> str:
    """``"cuda"`` or ``"cpu"`` for this job.

    ``requested``: the model's ``device`` (``auto``: CUDA when visible; ``cuda``: a GPU wanted; ``cpu``);
    ``gpus``: the GPUs the job asked the scheduler for (its ``gpu`` resource, ``snakemake.resources.get("gpu")``
    in a rule script; ``None``: not known).
    Inside a SLURM job (``SLURM_JOB_ID`` set) that asked for no GPU the CPU is used even where the node's
    GPUs are visible to it: the scheduler granted none. Otherwise CUDA when torch sees a device (those
    ``CUDA_VISIBLE_DEVICES`` lists), else the CPU. ``env`` and ``cuda`` (whether CUDA is available)
    default to this process's.
    """
    if requested not in DEVICES:
        raise ValueError(f"device {requested!r}: expected one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return _say("cpu", "the model's device is cpu")
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    where = f"SLURM job {job}" if job else "this job"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    seen = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
    if job and gpus is not None and int(gpus) == 0:
        return _say("cpu", f"{where} asked the scheduler for no GPU ({seen})", warn=requested == "cuda")
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "a CUDA device"
        return _say("cuda", f"{name}, the first of the GPUs visible to {where} ({seen})")
    built = f"torch {torch.__version__}, " + (
        f"CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    )
    gpus = None if gpus is None else int(gpus)
    if gpus:
        granted = " and was granted" if job else ""
        why = f"{where} asked for {gpus} GPU{'s' if gpus > 1 else ''}{granted}, but CUDA is not available"
        return _say("cpu", f"{why} ({seen}; {built}): {ON_CPU}", warn=True)
    if requested == "cuda":
        return _say("cpu", f"the model asks for cuda, but CUDA is not available ({seen}; {built}): {ON_CPU}", warn=True)
    return _say("cpu", f"no CUDA device visible ({seen}; {built})")
