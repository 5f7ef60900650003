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
import math
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


def input_device(model):
    """The device a model's inputs go to: that of its input embeddings, the first module the inputs meet.

    A model split by accelerate (``device_map``) runs each module on its own device; an offloaded module (``cpu`` or
    ``disk`` in the map, its weights on the meta device until it runs) runs on the model's main device, which its
    hook names. An unsplit model's embeddings are where all its weights are.
    """
    import torch

    placed = getattr(model, "hf_device_map", None)
    if placed:
        emb = model.get_input_embeddings()
        name = next(n for n, m in model.named_modules() if m is emb)
        # the map's entry that holds the embeddings: its own name, a parent's, or "" (the whole model)
        owner = max((k for k in placed if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
        device = placed.get(owner)
        if device not in (None, "cpu", "disk"):
            return torch.device(device if isinstance(device, str) else f"cuda:{device}")
        gpus = [d for d in placed.values() if d not in ("cpu", "disk")]  # offloaded modules run on the first GPU
        return torch.device(gpus[0] if isinstance(gpus[0], str) else f"cuda:{gpus[0]}") if gpus else torch.device("cpu")
    return next(model.parameters()).device


# a model's weights may fill at most this share of the memory it is given; the rest holds the activations, the
# CUDA context and the allocator's slack (transformers' own device_map "auto" keeps 10% of each GPU free too)
WEIGHT_SHARE = 0.9


def gpus_needed(weight_bytes: int, gpu_bytes: int) -> int:
    """How many GPUs of ``gpu_bytes`` each hold ``weight_bytes`` of weights within :data:`WEIGHT_SHARE` (at least 1)."""
    return max(1, math.ceil(weight_bytes / (WEIGHT_SHARE * gpu_bytes)))


def host_memory() -> int:
    """Bytes of RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_memories() -> list[int]:
    """Bytes of memory of each GPU visible to this job (``[]`` without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
