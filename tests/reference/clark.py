"""Clark's JS distances, syntax-head correctness and coreference items on stored maps (the references
of :class:`headatlas.clark.reducers.JSReducer` and the syntax reducers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from headatlas.clark.clustering import js_sums, smoothed_cells
from headatlas.clark.syntax import Correctness, HeadSettings, collect_correctness, iter_word_maps
from headatlas.core.data import Record
from headatlas.core.progress import progress
from headatlas.core.store import AttentionStore


def js_distance_matrix(
    store, n_sequences: int = 200, smoothing: float = 1e-3, max_elements: int = 1_000_000
) -> tuple[np.ndarray, int, int]:
    """Clark's summed JS distance between every pair of heads (layer-major order, L*H heads)
    over the first ``n_sequences`` sequences of an :class:`AttentionStore`.

    Returns (D [L*H, L*H], sequences used, query tokens summed over).
    """
    causal = store.meta.get("model_kind") == "decoder"
    n_heads = store.n_layers * store.n_heads
    total = np.zeros((n_heads, n_heads))
    k_stop = min(n_sequences, len(store)) if n_sequences else len(store)
    tokens = 0
    for k in progress(range(k_stop), f"JS distances {store.meta.get('model', '')}", unit="sequences"):
        maps = np.concatenate([store.maps(layer, k) for layer in range(store.n_layers)])
        total += js_sums(smoothed_cells(maps, causal, smoothing).astype(np.float32), max_elements)
        tokens += maps.shape[-1]
    return total, k_stop, tokens


def store_correctness(
    store: AttentionStore, records: Sequence[Record], settings: HeadSettings = HeadSettings(), chunk: int = 32
) -> Correctness:
    s = settings
    items = (
        (wm, records[store.record_index[wm.k]], int(store.n_words[wm.k]))
        for wm in progress(
            iter_word_maps(store, s.word_mode, chunk),
            f"syntax heads {store.meta.get('model', '')}",
            len(store),
            "sentences",
        )
    )
    return collect_correctness(items, store.n_layers, store.n_heads, s.offsets, s.poss_rule)


def store_items(store: AttentionStore, records: Sequence[Record], split: str, mode: str = "mean", chunk: int = 8):
    for wm in iter_word_maps(store, mode, chunk):
        yield wm, records[store.record_index[wm.k]], int(store.n_words[wm.k]), split
