"""Helpers for the thin rule scripts: logging to the rule's log file, thread limits, input checks; the library's\nroute onto the jobs' PYTHONPATH."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys

from .device import job_device
from .integrity import check_inputs
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
        log.error("%s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))

    sys.excepthook = hook
    n = threads if threads is not None else snakemake.threads
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("TQDM_DISABLE", "1")  # weight-loading and GGUF bars: noise in a workflow's output
    pin_torch_threads(n)
    after_import("transformers", _transformers_to_log)

    check_inputs(getattr(snakemake, "input", ()))
    return log


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
