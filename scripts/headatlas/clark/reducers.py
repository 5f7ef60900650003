"""Clark et al.'s per-head statistics as reducers (:mod:`headatlas.core.reduce`): the same numbers as
``surface_table`` (tests/reference/surface.py) and ``js_distance_matrix`` (tests/reference/clark.py),
computed from each layer's :class:`~headatlas.core.layer_view.LayerView` (maps or map-free) of a padded batch, on
the device where the attention is.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP
from ..core.layer_view import offset_target
from ..core.patterns import prev_token_score
from ..core.reducer import Needs, ReduceBatch, ReduceError, Reducer, check_layers_done, stack_layers
from .clustering import js_sums, sample_heads, smoothed_cells
from .surface import STATS, SurfaceSettings, punct_mask

COL = {s: i for i, s in enumerate(STATS)}


def surface_from_shares(sums: tuple, f: dict):
    """[..., B, H, len(STATS)] float64 statistics (NaN where undefined) from :func:`surface_sums` (or its parts
    stacked over layers in a leading axis: the same float64 operations, once per batch instead of once per
    layer), ``f`` from :func:`_float_masks`."""
    import torch

    shares, next_self, prev, to_sep, ent = sums
    next_self = next_self.double() / f["n"]
    diag = torch.stack([next_self[..., 0], prev, next_self[..., 1]], -1)  # next, prev, self
    # [next, prev, self, cls, sep, punct, sep_to_sep, other_to_sep, entropy, cls_entropy, 0] -> STATS order
    core = torch.cat(
        [diag, shares, to_sep.double() @ f["sep_w"], ent.double() @ f["ent_w"], torch.zeros_like(diag[..., :1])], -1
    )
    out = core.index_select(-1, f["order"]) + f["constant"][:, None, :]  # [..., B, H, S]
    return torch.where(f["defined"][:, None, :], out, math.nan)


def key_types(batch: ReduceBatch, causal: bool) -> np.ndarray:
    """[B, n, 3] bool: the first-token type ([CLS] for encoders, BOS for decoders), [SEP] and punctuation
    (:func:`~headatlas.clark.surface.punct_mask`): the key types of ``cls``, ``sep`` and ``punct``."""
    key = ("surface_key_types", causal)
    if batch.recall(key) is None:
        bsz, n = batch.special.shape
        first = batch.special == (SPECIAL_BOS if causal else SPECIAL_CLS)
        punct = punct_mask(batch.piece, batch.special).reshape(bsz, n)  # one call per batch
        batch.keep(key, np.stack([first, batch.special == SPECIAL_SEP, punct], -1))
    return batch.recall(key)


def _float_masks(batch: ReduceBatch, dev, causal: bool, smoothing: float) -> dict:
    """The layer-independent float masks of a batch for :func:`surface_from_shares` (cached on the batch;
    nothing of n x n size)."""
    import torch

    key = ("surface", str(dev), causal, smoothing)
    if batch.recall(key) is not None:
        return batch.recall(key)
    m = batch.masks(dev, causal)
    valid = m["valid"]
    bsz, n = valid.shape
    special = batch.tensor("special", dev)
    nf = batch.tensor("lengths", dev).double()
    first, sep, punct = torch.as_tensor(key_types(batch, causal), device=dev).unbind(-1)
    other = valid & ~sep
    idx = torch.arange(n, device=dev, dtype=torch.float64)
    if causal:
        uniform = (torch.log(idx + 1)[None, :] * valid).sum(-1) / nf
        summary = batch.tensor("lengths", dev) - 1
        has_summary = torch.ones(bsz, dtype=torch.bool, device=dev)
    else:
        is_cls = special == SPECIAL_CLS
        uniform = torch.log(nf)
        has_summary = is_cls.any(1)
        summary = torch.where(has_summary, is_cls.int().argmax(1), 0)
    has_first, has_sep, has_other = first.any(1), sep.any(1), sep.any(1) & other.any(1)
    const = torch.zeros((bsz, len(STATS)), dtype=torch.float64, device=dev)
    const[:, COL["entropy_uniform"]] = uniform
    const[:, COL["cls_entropy_uniform"]] = torch.log(nf)
    defined = torch.ones((bsz, len(STATS)), dtype=torch.bool, device=dev)
    defined[:, COL["next"]] = not causal
    defined[:, COL["cls"]] = has_first
    defined[:, COL["sep"]] = has_sep
    defined[:, COL["sep_to_sep"]] = has_sep
    defined[:, COL["other_to_sep"]] = has_other
    defined[:, COL["cls_entropy"]] = has_summary
    defined[:, COL["cls_entropy_uniform"]] = has_summary
    summary_row = torch.zeros((bsz, n), dtype=torch.float64, device=dev)
    summary_row[torch.arange(bsz, device=dev), summary] = 1.0
    names = ["next", "prev", "self", "cls", "sep", "punct", "sep_to_sep", "other_to_sep", "entropy", "cls_entropy"]
    out = {
        "n": nf[:, None, None],
        "keys": torch.stack([first, sep, punct], -1).double() / nf[:, None, None],  # [B, n, 3]
        "sep_w": torch.stack(
            [sep.double() / sep.sum(1).clamp(min=1)[:, None], other.double() / other.sum(1).clamp(min=1)[:, None]], -1
        ),  # [B, n, 2]
        "ent_w": torch.stack([valid.double() / nf[:, None], summary_row], -1),  # [B, n, 2]
        "order": torch.as_tensor([names.index(s) if s in names else len(names) for s in STATS], device=dev),
        "summary": summary,
        "constant": const,
        "defined": defined,
    }
    batch.keep(key, out)
    return out


# --- one layer's sums, from the layer view ------------------------------------------------------------------------


def surface_needs(batch: ReduceBatch, causal: bool, smoothing: float):
    """What :func:`surface_sums` reads (:class:`~headatlas.core.reducer.Needs`): targets at offsets
    +1 (encoders), 0 and -1; the entropy, or with smoothing the smoothed rows' entropy. The key types' masses
    need no pass (:func:`typed_key_mass`)."""
    offsets = (0, -1) if causal else (1, 0, -1)
    return Needs(
        entropy=smoothing == 0,
        smoothed_entropy=smoothing if smoothing > 0 else None,
        targets={f"offset:{o}": offset_target(batch, o) for o in offsets},
    )


def typed_keys(batch: ReduceBatch, causal: bool, device) -> tuple:
    """(positions [B, m], weights [B, m, 3]) of each sequence's keys of a type of :func:`key_types` (m = the
    most such keys in one sequence; filler: key 0 with weight 0): :func:`~headatlas.core.layer_view.key_columns` for key types that are
    not all special kinds (punctuation). Cached on the batch."""
    import torch

    key = ("surface_typed_keys", causal, str(device))
    if batch.recall(key) is None:
        types = key_types(batch, causal)
        hit = types.any(-1)
        m = max(1, int(hit.sum(1).max()) if hit.size else 1)
        b, j = np.nonzero(hit)
        rank = (np.cumsum(hit, 1) - 1)[b, j]
        pos = np.zeros((len(batch), m), dtype=np.int64)
        w = np.zeros((len(batch), m, types.shape[-1]), dtype=np.float32)
        pos[b, rank] = j
        w[b, rank] = types[b, j]
        batch.keep(key, (torch.as_tensor(pos, device=device), torch.as_tensor(w, device=device)))
    return batch.recall(key)


def surface_sums(view, batch: ReduceBatch, causal: bool, smoothing: float) -> tuple:
    """One layer's sums from its :class:`~headatlas.core.layer_view.LayerView`: the key-type shares [B, H, 3],
    next and self [B, H, 2] from the offset targets, prev [B, H] (:func:`~headatlas.core.patterns.prev_token_score`
    of the offset -1 target), the [SEP] mass per query [B, H, n] from the typed keys (``key_mass``) and the row
    entropy [B, H, n] (eps = 0) or the smoothed rows' entropy: what :func:`surface_from_shares` turns into the
    statistics. Cells in float32, everything after the row sums in float64."""
    import torch

    n = batch.tensor("lengths", view.device).double()[:, None, None]  # [B, 1, 1]
    cols = view.key_mass(*typed_keys(batch, causal, view.device))  # [B, H, n, 3], 0 on padded rows
    shares = cols.sum(2).double() / n
    nxt = view.target("offset:1") if not causal else torch.zeros_like(view.target("offset:0"))
    next_self = torch.stack([nxt.sum(-1), view.target("offset:0").sum(-1)], -1)  # [B, H, 2]
    prev = prev_token_score(view.target("offset:-1"), n[:, :, 0]).double()
    ent = view.entropy() if smoothing == 0 else view.smoothed_entropy(smoothing)
    return shares, next_self, prev, cols[..., 1], ent


class SurfaceReducer(Reducer):
    """Clark's surface statistics per head: ``result()`` is ``surface_table`` (tests/reference/surface.py)'s
    table (means over the sequences where a statistic is defined)."""

    name = "clark_surface"
    analysis = "clark_surface"

    @classmethod
    def from_settings(cls, settings: SurfaceSettings) -> "SurfaceReducer":
        """The reducer of analysis.clark_surface's settings (the plan and the rule script build it here)."""
        return cls(settings.smoothing)

    def __init__(self, smoothing: float = 1e-4):
        self.smoothing = smoothing

    def start(self, info) -> None:
        super().start(info)
        self.total = None  # [L, H, S] running sums on the device, float64
        self.count = None
        self.open = 0  # batches whose layers have not all come yet

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        return surface_needs(batch, causal, self.smoothing)

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """Per layer its sums (:func:`surface_sums`); when the batch's last layer has come, the statistics of all
        its layers at once (:func:`surface_from_shares` on the sums stacked over layers: a fixed number of small
        operations per batch instead of per layer)."""
        self._add(layer, surface_sums(view, batch, self.info.causal, self.smoothing), batch, view.device)

    def _add(self, layer: int, sums: tuple, batch: ReduceBatch, dev) -> None:
        """Keep one layer's sums; at the batch's last layer the statistics [L, B, H, S] of the sums stacked over
        layers, added to the running sums."""
        import torch

        key = ("clark_surface", id(self))
        done = batch.recall(key)
        if done is None:  # layer -> sums (kept with the batch: replay interleaves batches)
            done = batch.keep(key, {})
            self.open += 1
        done[layer] = sums
        if len(done) < self.info.n_layers:
            return
        batch.forget(key)
        self.open -= 1
        layers, sums = stack_layers(done)
        s = surface_from_shares(sums, _float_masks(batch, dev, self.info.causal, self.smoothing))
        ok = ~torch.isnan(s)  # [L, B, H, S]
        if self.total is None:
            shape = (self.info.n_layers, self.info.n_heads, len(STATS))
            self.total = torch.zeros(shape, dtype=torch.float64, device=dev)
            self.count = torch.zeros(shape, dtype=torch.float64, device=dev)
        self.total[layers] += torch.where(ok, s, 0.0).sum(1)
        self.count[layers] += ok.sum(1)

    def result(self) -> pd.DataFrame:
        info = self.info
        check_layers_done(self, self.open)
        if self.total is None:
            if info.n_sequences:
                raise ValueError(f"{self.name}: no sequence was reduced")
            zeros = np.zeros((info.n_layers, info.n_heads, len(STATS)))  # an empty shard: nothing to add
            return _surface_frame(zeros, zeros.copy(), info.model, info.model_kind, 0)
        return _surface_frame(
            self.total.cpu().numpy(), self.count.cpu().numpy(), info.model, info.model_kind, info.n_sequences
        )

    def params(self) -> dict:
        return {"smoothing": float(self.smoothing)}

    def to_arrays(self, result: pd.DataFrame) -> dict:
        a = result.attrs
        return {
            "total": a["total"],
            "count": a["count"],
            "model": np.array([a["model"]]),
            "model_kind": np.array([a["model_kind"]]),
            "n_sequences": np.array(a["n_sequences"]),
        }

    @classmethod
    def from_arrays(cls, arrays: dict) -> pd.DataFrame:
        return _surface_frame(
            arrays["total"], arrays["count"], str(arrays["model"][0]), str(arrays["model_kind"][0]),
            int(arrays["n_sequences"]),
        )  # fmt: skip

    @classmethod
    def combine(cls, parts: list) -> pd.DataFrame:
        a = [p.attrs for p in parts]
        for x in a[1:]:
            if (x["model"], x["model_kind"], x["total"].shape) != (
                a[0]["model"],
                a[0]["model_kind"],
                a[0]["total"].shape,
            ):
                raise ReduceError(f"{cls.name}: shards of different models ({x['model']!r}, {a[0]['model']!r})")
        return _surface_frame(
            sum(x["total"] for x in a), sum(x["count"] for x in a), a[0]["model"], a[0]["model_kind"],
            sum(x["n_sequences"] for x in a),
        )  # fmt: skip


def _surface_frame(total: np.ndarray, count: np.ndarray, model: str, kind: str, n_sequences: int) -> pd.DataFrame:
    """``surface_table`` (tests/reference/surface.py)'s table from the sums [L, H, S] and counts of defined
    values; the sums ride along in ``attrs`` (what :meth:`SurfaceReducer.combine` adds)."""
    n_layers, n_heads, _ = total.shape
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    rows = [
        {
            "model": model,
            "model_kind": kind,
            "layer": layer,
            "head": head,
            "n_sequences": n_sequences,
            **dict(zip(STATS, mean[layer, head])),
        }
        for layer in range(n_layers)
        for head in range(n_heads)
    ]
    out = pd.DataFrame(rows)
    out.attrs.update(total=total, count=count, model=model, model_kind=kind, n_sequences=int(n_sequences))
    return out


class JSResult(tuple):
    """(D [m, m], sequences used, query tokens) of :class:`JSReducer`, with ``heads`` (the layer-major index of
    D's rows: every head, m = L*H, or the sample of ``max_heads``; None: every head) and what combining shards
    needs: ``limit`` (the reducer's n_sequences), ``first_index`` (records before the feed) and ``n_fed``
    (sequences in the feed)."""

    def __new__(cls, d, k: int, tokens: int, limit: int = 0, first_index: int = 0, n_fed: int | None = None,
                heads: np.ndarray | None = None):  # fmt: skip
        out = super().__new__(cls, (d, int(k), int(tokens)))
        out.limit, out.first_index, out.n_fed = int(limit), int(first_index), int(k if n_fed is None else n_fed)
        out.heads = None if heads is None else np.asarray(heads, dtype=np.int64)
        return out


class JSReducer(Reducer):
    """Clark's summed JS distance between every pair of heads (all layers at once), over the first
    ``n_sequences`` sequences in feed order: ``js_distance_matrix`` (tests/reference/clark.py)'s
    (D [L*H, L*H], sequences used, query tokens). The sequences are taken one by one (each has its own
    n), on the host with the reference's :func:`~headatlas.clark.clustering.js_sums`: only the first
    ``n_sequences`` sequences' maps leave the device. Above ``max_heads`` heads, the heads of
    :func:`~headatlas.clark.clustering.sample_heads` (``seed``) only: D [m, m] over them, their maps alone kept."""

    name = "clark_js"
    analysis = "clark_surface"
    keeps_layers = True

    @classmethod
    def from_settings(cls, settings: SurfaceSettings) -> "JSReducer":
        """The reducer of analysis.clark_surface's clustering settings (the plan and the rule script build it here)."""
        c = settings.clustering
        return cls(c.n_segments, c.smoothing, c.max_elements, c.max_heads, c.seed)

    def __init__(self, n_sequences: int = 200, smoothing: float = 1e-3, max_elements: int = 1_000_000,
                 max_heads: int | None = None, seed: int = 0):  # fmt: skip
        self.n_sequences, self.smoothing, self.max_elements = n_sequences, smoothing, max_elements
        self.max_heads, self.seed = max_heads, seed

    def start(self, info) -> None:
        super().start(info)
        # the first n_sequences of the corpus: a shard that starts at record first_index takes what is left
        left = max(0, self.n_sequences - info.first_index)
        self.k_stop = min(left, info.n_sequences) if self.n_sequences else info.n_sequences
        self.heads = sample_heads(info.n_layers, info.n_heads, self.max_heads, self.seed)
        h = len(self.heads)
        layer, head = np.divmod(self.heads, info.n_heads)
        # per layer the sampled heads (None: every head, the maps as they come)
        self.picks = None if h == info.n_layers * info.n_heads else [head[layer == i] for i in range(info.n_layers)]
        self.total = np.zeros((h, h))
        self.tokens = 0

    def _pick(self, maps, layer: int):
        """One layer's maps [b, H, n, n] -> those of its sampled heads."""
        return maps if self.picks is None else maps[:, self.picks[layer]]

    def wants(self, batch: ReduceBatch) -> bool:
        return bool((batch.seq < self.k_stop).any())

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """The wanted sequences' rows (:meth:`~headatlas.core.layer_view.LayerView.rows`; only the first
        ``n_sequences`` of the corpus), kept until the batch's last layer; the rest of the corpus needs none."""
        import torch

        wanted = np.flatnonzero(batch.seq < self.k_stop)
        if not len(wanted):
            return
        key = ("clark_js_rows", id(self))
        kept = batch.memo(key, dict)
        kept[layer] = self._pick(view.rows(seqs=wanted), layer)
        if len(kept) == self.info.n_layers:
            batch.forget(key)
            self._add(torch.cat([kept[i] for i in range(self.info.n_layers)], dim=1), wanted, batch)

    def _add(self, stacked, wanted: np.ndarray, batch: ReduceBatch) -> None:
        """The JS sums of the ``wanted`` sequences' maps ``stacked`` [len(wanted), m, n, n] (the heads of
        ``self.heads``, layer-major)."""
        for i, b in enumerate(wanted):  # per sequence: each has its own length and its own JS sum
            n = int(batch.lengths[b])
            maps = stacked[i, :, :n, :n].float().cpu().numpy()
            self.total += js_sums(
                smoothed_cells(maps, self.info.causal, self.smoothing).astype(np.float32), self.max_elements
            )
            self.tokens += n

    def result(self) -> JSResult:
        return JSResult(
            self.total, self.k_stop, self.tokens, self.n_sequences, self.info.first_index, self.info.n_sequences,
            self.heads,
        )  # fmt: skip

    def params(self) -> dict:
        """(max_heads and seed are checked through the heads they sample: :meth:`heads_of`.)"""
        return {
            "n_sequences": int(self.n_sequences),
            "smoothing": float(self.smoothing),
            "max_elements": int(self.max_elements),
        }

    def heads_of(self, result: JSResult, n_layers: int, n_heads: int) -> np.ndarray:
        """The heads of ``result``'s rows, checked against this reducer's sample of an L x H model (a reduction
        stored under another max_heads or seed is an error that says to rerun)."""
        got, want = _heads(result), sample_heads(n_layers, n_heads, self.max_heads, self.seed)
        if not np.array_equal(got, want):
            raise ReduceError(
                f"{self.name}: the stored distances are over {len(got)} heads, but clustering.max_heads "
                f"{self.max_heads} with seed {self.seed} samples {len(want)} (other heads); rerun the extraction"
            )
        return got

    def to_arrays(self, result: JSResult) -> dict:
        return {
            "distance": result[0],
            "n_sequences": np.array(result[1]),
            "tokens": np.array(result[2]),
            "limit": np.array(result.limit),
            "first_index": np.array(result.first_index),
            "n_fed": np.array(result.n_fed),
            **({} if result.heads is None else {"heads": result.heads}),
        }

    @classmethod
    def from_arrays(cls, arrays: dict) -> JSResult:
        return JSResult(
            arrays["distance"], int(arrays["n_sequences"]), int(arrays["tokens"]), int(arrays["limit"]),
            int(arrays["first_index"]), int(arrays["n_fed"]), arrays.get("heads"),
        )  # fmt: skip

    @classmethod
    def combine(cls, parts: list) -> JSResult:
        """The sum over shards. Each shard took the first ``limit - first_index`` of its sequences, which is the
        corpus's first ``limit`` sequences when no earlier record was skipped (too long): checked."""
        before = 0  # sequences in earlier shards
        for i, p in enumerate(parts):
            want = min(max(0, p.limit - before), p.n_fed) if p.limit else p.n_fed
            if p[1] != want:
                raise ReduceError(
                    f"{cls.name}: shard {i} summed {p[1]} sequences, but the first {p.limit} of the corpus need {want} of it "
                    f"(records of an earlier shard were skipped as too long); extract this corpus in one shard or with overflow: truncate"
                )
            before += p.n_fed
            if not np.array_equal(_heads(p), _heads(parts[0])):
                raise ReduceError(f"{cls.name}: shard {i} sampled other heads than shard 0 (max_heads, seed)")
        d = sum(p[0] for p in parts)
        return JSResult(d, sum(p[1] for p in parts), sum(p[2] for p in parts), parts[0].limit, 0, before,
                        parts[0].heads)  # fmt: skip


def _heads(result: JSResult) -> np.ndarray:
    """The layer-major heads of a result's rows (a result stored before ``heads`` existed: every head)."""
    return np.arange(len(result[0])) if result.heads is None else result.heads


def fused_plan(section: dict, corpus: str) -> list[Reducer]:
    """The reducers analysis clark_surface needs on ``corpus`` (its validated config section): the surface
    statistics and the JS distances with the clustering settings on its ``corpora``; the surface statistics
    alone on its ``long_corpora`` (no reducer that keeps whole rows, so such a corpus runs map-free where the
    model allows); none elsewhere."""
    s = SurfaceSettings.pick(section)
    if corpus in s.long_corpora:
        return [SurfaceReducer.from_settings(s)]
    if corpus not in (section.get("corpora") or []):
        return []
    return [SurfaceReducer.from_settings(s), JSReducer.from_settings(s)]
