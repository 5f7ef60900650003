"""Helpers for the thin rule scripts: logging to the rule's log file, thread limits."""

from __future__ import annotations

import logging
import os
import sys


def setup(snakemake, threads: int | None = None) -> logging.Logger:
    """Send log records (and uncaught errors) to the rule's log file; pin thread counts."""
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
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass
    return log


def as_dirs(x) -> list[str]:
    """A rule input of shard directories as a list (one directory comes back as a string)."""
    return [x] if isinstance(x, str) else list(x)
