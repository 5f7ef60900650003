"""Helpers for the thin rule scripts: logging to the rule's log file, thread limits, input checks; the library's\nroute onto the jobs' PYTHONPATH."""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import logging
import os
import resource
import sys
import time

from .device import job_device
from .integrity import check_inputs
from .io import atomic_path
from .models import ModelSpec


def export_library_path(scripts_dir: str) -> None:
    """Put ``scripts_dir`` (where the headatlas package lives) first on ``PYTHONPATH`` in this process's
    environment, once: the Snakefile calls it, and every job it starts inherits it (local, SLURM, conda env)."""
    path = os.environ.get("PYTHONPATH", "")
    if scripts_dir not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (scripts_dir, path) if p)


def model_job(snakemake, entry: dict | None = None) -> tuple[ModelSpec, str | None, str]:
    """What a model-running rule script loads its model with: the model's spec (``entry``, default
    ``params.model``), its cache directory (``input.model``, a ``model_cache`` input; None for a model read from
    its source) and the job's device (:func:`headatlas.core.device.job_device`, from the model's ``device``
    setting and the GPU the scheduler granted, ``resources.gpu``)."""
    spec = ModelSpec.from_config(snakemake.params.model if entry is None else entry)
    cache = snakemake.input.model[0] if snakemake.input.model else None
    return spec, cache, job_device(spec.device, snakemake.resources.get("gpu"))


def setup(snakemake, threads: int | None = None) -> logging.Logger:
    """Send log records (and uncaught errors) to the rule's log file; pin thread counts; check the rule's sealed
    inputs (:func:`headatlas.core.integrity.check_inputs`)."""
    log_path = snakemake.log[0] if len(snakemake.log) else None
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(_problems_and_progress)  # the rule's log file gets every record
    console.addFilter(_quiet_transformers)
    handlers = [console]
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers, force=True
    )
    log = logging.getLogger("headatlas")

    def hook(exc_type, exc, tb):
        _FAILED.append(exc_type.__name__)
        log.error("%s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))

    sys.excepthook = hook
    n = threads if threads is not None else snakemake.threads
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("TQDM_DISABLE", "1")  # weight-loading and GGUF bars: noise in a workflow's output
    pin_torch_threads(n)
    after_import("transformers", _transformers_to_log)

    check_inputs(getattr(snakemake, "input", ()))
    if log_path:
        atexit.register(write_cost_record, snakemake, cost_record_path(log_path), log)
    return log


COST_SUFFIX = ".cost.json"
_FAILED: list[str] = []  # the uncaught error that ends the job, if any (its cost record says so)


def cost_record_path(log_path: str) -> str:
    """Where a job's cost record lies: beside its log file (``<log>.cost.json``; headatlas.core.plan reads it)."""
    return f"{log_path}{COST_SUFFIX}"


def _process_start() -> float:
    """This process's start (epoch seconds), from /proc; the current time where /proc has no answer."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_STARTED = _process_start()


def _path_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path) if os.path.exists(path) else 0


def cost_record(snakemake) -> dict:
    """The job's measured cost: rule, wildcards, threads, wall seconds since the process started, CPU seconds
    (user + system, this process and its waited-for children), peak RSS in bytes (the largest of the process and
    its children; Linux reports KiB), and the bytes of its inputs and outputs."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    wildcards = getattr(snakemake, "wildcards", {}) or {}
    outputs = [str(p) for p in getattr(snakemake, "output", ())]
    inputs = [str(p) for p in getattr(snakemake, "input", ())]
    return {
        "rule": getattr(snakemake, "rule", None),
        "wildcards": {str(k): str(v) for k, v in dict(wildcards.items()).items()},
        "threads": getattr(snakemake, "threads", None),
        "wall_s": round(time.time() - _STARTED, 3),
        "cpu_s": round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 3),
        "peak_rss_bytes": max(own.ru_maxrss, kids.ru_maxrss) * 1024,
        "output_bytes": sum(_path_bytes(p) for p in outputs),
        "input_bytes": sum(_path_bytes(p) for p in inputs),
        "outputs": outputs,
        "log": str(snakemake.log[0]),
        "failed": _FAILED[-1] if _FAILED else None,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_cost_record(snakemake, path: str, log: logging.Logger) -> None:
    """Write the job's cost record (:func:`cost_record`) to ``path`` atomically, at the job's exit; a failure is
    logged and never fails the job."""
    try:
        record = cost_record(snakemake)
        with atomic_path(path, sealed=False) as tmp:
            tmp.write_text(json.dumps(record, indent=1) + "\n")
    except Exception as e:  # noqa: BLE001 - a cost record is never worth a failed job
        log.warning("no cost record written to %s: %s: %s", path, type(e).__name__, e)


def _problems_and_progress(record: logging.LogRecord) -> bool:
    """Console filter: warnings, errors and progress lines (``headatlas.progress``) reach the terminal; a job's
    other records go to its log file only."""
    return record.levelno >= logging.WARNING or record.name == "headatlas.progress"


def _quiet_transformers(record: logging.LogRecord) -> bool:
    """Console filter: transformers' reports below ERROR (its load report: missing or unexpected weights) go to
    the rule's log file only."""
    return record.levelno >= logging.ERROR or not record.name.startswith("transformers")


def _transformers_to_log(module) -> None:
    """transformers logs through our handlers (so the filter above applies) and draws no progress bars."""
    from transformers.utils import logging as tlog

    tlog.disable_default_handler()
    tlog.enable_propagation()
    tlog.disable_progress_bar()


def pin_torch_threads(n: int) -> None:
    """torch.set_num_threads(n) now if torch is loaded, else right after its first import.

    Importing torch costs about a CPU second; a rule script that never uses it does not pay it.
    """
    after_import("torch", lambda torch: torch.set_num_threads(n))


def after_import(name: str, fn) -> None:
    """Call ``fn(module)`` now if top-level module ``name`` is loaded, else right after its first import (one
    callback per module: a second call replaces the first)."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.name == name:
            finder.fn = fn
            return
    sys.meta_path.insert(0, _AfterImport(name, fn))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Import hook: runs a callback once module ``name`` has been imported, then removes itself."""

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, fn = spec.loader.exec_module, self.fn

        def exec_and_call(module):
            exec_module(module)
            fn(module)

        spec.loader.exec_module = exec_and_call
        return spec


def as_dirs(x) -> list[str]:
    """A rule input of shard directories as a list (one directory comes back as a string)."""
    return [x] if isinstance(x, str) else list(x)
