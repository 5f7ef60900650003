"""Helpers for the thin rule scripts: logging to the rule's log file, thread limits, input checks."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys


def setup(snakemake, threads: int | None = None) -> logging.Logger:
    """Send log records (and uncaught errors) to the rule's log file; pin thread counts; check the rule's sealed
    inputs (:func:`headatlas.core.integrity.check_inputs`)."""
    log_path = snakemake.log[0] if len(snakemake.log) else None
    handlers = [logging.StreamHandler(sys.stderr)]
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
    pin_torch_threads(n)
    from .integrity import check_inputs

    check_inputs(getattr(snakemake, "input", ()))
    return log


def pin_torch_threads(n: int) -> None:
    """torch.set_num_threads(n) now if torch is loaded, else right after its first import.

    Importing torch costs about a CPU second; a rule script that never uses it does not pay it.
    """
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _TorchThreads):
            finder.n = n
            return
    sys.meta_path.insert(0, _TorchThreads(n))


class _TorchThreads(importlib.abc.MetaPathFinder):
    """Import hook: pins torch's thread count once `import torch` has run, then removes itself."""

    def __init__(self, n: int):
        self.n = n

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, n = spec.loader.exec_module, self.n

        def exec_and_pin(module):
            exec_module(module)
            module.set_num_threads(n)

        spec.loader.exec_module = exec_and_pin
        return spec


def as_dirs(x) -> list[str]:
    """A rule input of shard directories as a list (one directory comes back as a string)."""
    return [x] if isinstance(x, str) else list(x)
