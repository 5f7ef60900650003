"""Where in a long input do heads look? Per-head statistics by query-position bucket, as a reducer.

For every head and every bucket of query positions ``[edges[k], edges[k+1])`` (the last bucket is open),
the mean over the real query tokens in it of

- ``sink``: attention to the first token of the input (position 0: BOS for decoders, [CLS] for encoders);
- ``local``: attention within Pande et al.'s local window, keys j with |i - j| <= ``window`` (i itself
  included; j <= i under a causal mask), the sieve's ``local`` role;
- ``entropy``: the row's entropy in nats, -sum_j A_ij ln A_ij (unsmoothed);
- ``distance``: the mean attention distance in tokens, sum_j A_ij |i - j|.

Positions count tokens from the start of the input (0 = BOS / [CLS]). The reducer follows the Reducer API
of :mod:`headatlas.core.reduce` (vectorised over sequences, heads and tokens; padding masked) through the layer
view: map-free, fused (during the forward pass) and replayed (from a store) it gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.layer_view import key_positions, key_target, offset_target
from ..core.patterns import local_band
from ..core.reducer import Needs, ReduceBatch, Reducer
from ..core.settings import Settings

STATS = ("sink", "local", "entropy", "distance")
UNITS = {"sink": "fraction", "local": "fraction", "entropy": "nats", "distance": "tokens"}
DEFAULT_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, kw_only=True)
class PositionSettings(Settings):
    """The keys of analysis.position (workflow/schemas/position.schema.yaml) the reducer reads."""

    SECTION = "analysis.position"

    local_window: int = 2
    edges: tuple[int, ...] = DEFAULT_EDGES

    def reducer(self) -> "PositionReducer":
        return PositionReducer(self.local_window, self.edges)


def bucket_of(positions: np.ndarray, edges) -> np.ndarray:
    """The bucket index of every query position: k with edges[k] <= position < edges[k+1] (last open)."""
    return np.searchsorted(np.asarray(edges), positions, side="right") - 1


def check_edges(edges) -> tuple[int, ...]:
    edges = tuple(int(e) for e in edges)
    if not edges or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"position buckets: edges must start at 0 and increase strictly, not {list(edges)}")
    return edges


def position_stats(view, batch: ReduceBatch, causal: bool, window: int):
    """[B, H, n, 4] float32 statistics (STATS order) of every query row of a layer view (0 on padding): sink and
    local from 1 + the band's targets, the entropy, distance from A.pos (and, for an encoder, the
    lower pass: sum_j A_ij |i - j| = (A.pos)_i - i + 2 (i L_i - sum_{j <= i} A_ij j), L_i = sum_{j <= i} A_ij)."""
    import torch

    valid = view.valid[:, None]
    sink = view.target("key:0")
    local = sum(view.target(f"offset:{o}") for o in local_band(window, causal))
    i = torch.arange(batch.n, device=valid.device, dtype=torch.float32)
    apos = view.value("pos")[..., 0]
    if causal:
        dis = i - apos
    else:
        low = view.lower("one_pos")
        dis = apos - i + 2 * (i * low[..., 0] - low[..., 1])
    return torch.stack([sink, local, view.entropy(), torch.where(valid, dis, 0.0)], -1)


def position_needs(batch: ReduceBatch, causal: bool, window: int):
    """The passes :func:`position_stats` needs (:class:`~headatlas.core.mapfree.Needs`)."""
    import torch

    pos = key_positions(batch, "cpu")
    lower = {} if causal else {"one_pos": torch.cat([torch.ones_like(pos), pos], -1)}
    targets = {"key:0": key_target(batch, 0)} | {
        f"offset:{o}": offset_target(batch, o) for o in local_band(window, causal)
    }
    return Needs(entropy=True, values={"pos": pos}, lower=lower, targets=targets)


class PositionReducer(Reducer):
    """Per head and query-position bucket: mean sink, local, entropy and distance (module docstring).
    ``result()`` is a table with one row per (layer, head, bucket)."""

    name = "position"
    analysis = "position"

    def __init__(self, window: int = 2, edges=DEFAULT_EDGES):
        if window < 0:
            raise ValueError(f"local window must be >= 0, not {window}")
        self.window, self.edges = int(window), check_edges(edges)

    def params(self) -> dict:
        return {"window": self.window, "edges": list(self.edges)}

    def start(self, info) -> None:
        super().start(info)
        self.total = None  # [L, H, K, 4] float64 running sums on the device
        self.count = np.zeros(len(self.edges), dtype=np.int64)  # query tokens per bucket (same for every head)
        self.seen = np.zeros(info.n_layers, dtype=bool)

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        return position_needs(batch, causal, self.window)

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        self._add(layer, position_stats(view, batch, self.info.causal, self.window), batch)

    def _add(self, layer: int, s, batch: ReduceBatch) -> None:
        """Add one layer's [B, H, n, 4] row statistics to the per-bucket sums."""
        import torch

        s = s.double()
        dev = s.device
        key = ("position_buckets", str(dev), self.edges)
        if batch.recall(key) is None:
            n = batch.n
            valid = np.arange(n)[None, :] < batch.lengths[:, None]
            onehot = np.zeros((len(batch), n, len(self.edges)), dtype=np.float64)
            b, i = np.nonzero(valid)
            onehot[b, i, bucket_of(i, self.edges)] = 1.0
            batch.keep(key, (torch.as_tensor(onehot, device=dev), onehot.sum((0, 1)).astype(np.int64)))
        onehot, counts = batch.recall(key)
        if self.total is None:
            shape = (self.info.n_layers, self.info.n_heads, len(self.edges), len(STATS))
            self.total = torch.zeros(shape, dtype=torch.float64, device=dev)
        self.total[layer] += torch.einsum("bhns,bnk->hks", s, onehot)
        if layer == 0:
            self.count += counts

    def result(self) -> pd.DataFrame:
        if self.total is None:
            raise ValueError(f"{self.name}: no sequence was reduced")
        return self.table(self.total.cpu().numpy(), self.count, self.info.model, self.info.n_sequences)

    def table(self, total: np.ndarray, count: np.ndarray, model: str, n_sequences: int) -> pd.DataFrame:
        """One row per (layer, head, non-empty bucket): the means (sums / query tokens)."""
        L, H, K, _ = total.shape
        keep = np.flatnonzero(count > 0)
        mean = total[:, :, keep] / count[keep][None, None, :, None]
        layer, head, k = (x.ravel() for x in np.meshgrid(range(L), range(H), range(len(keep)), indexing="ij"))
        stop = np.array(self.edges[1:] + (-1,))[keep]  # -1: the open last bucket
        out = pd.DataFrame(
            {
                "model": model,
                "layer": layer,
                "head": head,
                "bucket_start": np.array(self.edges)[keep][k],
                "bucket_stop": stop[k],
                "n_queries": count[keep][k],
                "n_sequences": n_sequences,
            }
        )
        for j, s in enumerate(STATS):
            out[s] = mean[..., j].ravel()
        return out

    # --- the fused-reducer contract: results as arrays, shards combined -------------------------
    def to_arrays(self, result: pd.DataFrame) -> dict[str, np.ndarray]:
        arrays = {c: result[c].to_numpy() for c in result.columns if c != "model"}
        arrays["model"] = result["model"].to_numpy().astype(str)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict) -> pd.DataFrame:
        cols = ["model", "layer", "head", "bucket_start", "bucket_stop", "n_queries", "n_sequences", *STATS]
        return pd.DataFrame({c: np.asarray(arrays[c]) for c in cols})

    @classmethod
    def combine(cls, parts: list) -> pd.DataFrame:
        """Shards' tables into one: means weighted by their query tokens, sequences added."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("position: no shard holds a sequence")
        df = pd.concat(parts, ignore_index=True)
        for s in STATS:
            df[s] = df[s] * df["n_queries"]
        keys = ["model", "layer", "head", "bucket_start", "bucket_stop"]
        g = df.groupby(keys, sort=True, as_index=False)[["n_queries", *STATS]].sum()
        for s in STATS:
            g[s] = g[s] / g["n_queries"]
        g.insert(6, "n_sequences", sum(int(p["n_sequences"].iloc[0]) for p in parts))
        return g


def fused_plan(section: dict, corpus: str) -> list[Reducer]:
    """The reducers the ``position`` analysis needs on ``corpus`` (the fused-reducer contract)."""
    if corpus not in section.get("corpora", []):
        return []
    return [PositionSettings.pick(section).reducer()]
