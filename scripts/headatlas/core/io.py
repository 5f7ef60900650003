"""Atomic file output: write under a temporary name, rename when complete (and seal: core.integrity); the TSV
writer; the readers of a table's shape and of its boolean columns."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from .integrity import seal, sealable


@contextmanager
def atomic_path(path: str | Path, sealed: bool | None = None):
    """Yield a temporary path next to ``path``; rename it to ``path`` only on success. The file is sealed
    (``<path>.sha256``, :func:`headatlas.core.integrity.seal`) unless ``sealed`` is false (default: every file
    but figures and pages)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{''.join(path.suffixes)}")
    try:
        yield tmp
        if sealed if sealed is not None else sealable(path):
            seal(path, digest_of=tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def head_shape(table) -> tuple[int, int]:
    """(layers, heads) of a per-head table with 0-based ``layer`` and ``head`` columns."""
    return layer_count(table), int(table["head"].max()) + 1


def layer_count(table) -> int:
    """The number of layers of a table with a 0-based ``layer`` column (per head or per layer)."""
    return int(table["layer"].max()) + 1


def flags(values, na: bool | None = False):
    """A column of booleans as read back from a TSV, as booleans: ``True``, the string ``"True"`` and the
    number 1 are true; ``False``, ``"False"``, 0 and any other value false; a missing value (an empty cell:
    NaN, None, NA) is ``na``, or stays missing with ``na=None``. ``values``: a pandas Series, an array, a list
    or one value. Returns a numpy bool array, with ``na=None`` a pandas "boolean" array; for one value, a
    bool (or ``pd.NA``)."""
    import numpy as np
    import pandas as pd

    if np.ndim(values) == 0:
        one = flags(pd.Series([values], dtype=object), na)
        return one[0] if na is None else bool(one[0])
    s = values if isinstance(values, pd.Series) else pd.Series(values)
    missing = s.isna().to_numpy(bool)
    v = s.to_numpy(object).copy()
    v[missing] = False
    true = (v.astype(str) == "True") | (v == 1)
    if na is None:
        return pd.arrays.BooleanArray(true & ~missing, missing)
    return np.where(missing, bool(na), true)


def write_tsv(table, path: str | Path, float_format: str | None = "%.6g", na_rep: str = "") -> None:
    """Write the pandas frame ``table`` to ``path`` as a TSV (no index; floats as ``float_format``, missing values
    as ``na_rep``), atomically and sealed (:func:`atomic_path`): the one TSV writer of the rule scripts."""
    with atomic_path(path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format=float_format, na_rep=na_rep)


COMPRESS_MIN_BYTES = 1 << 20
COMPRESS_CHUNK_BYTES = 512 << 10


def compressed(shape, dtype) -> dict:
    """h5py dataset options for a float dataset of ``shape`` and ``dtype``: from 1 MiB on, gzip (level 1) after a
    byte shuffle, in chunks of about 512 KiB along the first axis; smaller or non-float datasets stay plain.
    Lossless: attention-derived float32 data (word-level maps, per-head vectors, hidden states) shrinks to about
    0.85 of its size, and readers need nothing but h5py."""
    import numpy as np

    shape, dtype = tuple(int(x) for x in shape), np.dtype(dtype)
    if dtype.kind != "f" or not shape or int(np.prod(shape)) * dtype.itemsize < COMPRESS_MIN_BYTES:
        return {}
    row = max(1, int(np.prod(shape[1:])) * dtype.itemsize)
    chunk = (max(1, min(shape[0], COMPRESS_CHUNK_BYTES // row)),) + shape[1:]
    return {"compression": "gzip", "compression_opts": 1, "shuffle": True, "chunks": chunk}
