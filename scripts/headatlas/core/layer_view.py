"""What a reducer reads from one layer of one batch: :class:`LayerView`, with two backends.

- :class:`~headatlas.core.mapfree.FreeLayer`: from q, k and the log-sum-exp of the scores (and the passes the
  map-free attention computed beside its output), no [B, H, n, n] map;
- :class:`MapsLayer`: from the layer's maps (eager attention, or stored maps replayed), the reference.

A reducer declares per batch what it reads beyond rows and targets (:meth:`Reducer.layer_needs` ->
:class:`~headatlas.core.reducer.Needs`: value columns m, lower columns, the entropy, named targets); the feed
merges the declarations of its reducers into one :class:`LayerPlan` per batch, builds one view per layer and
hands it to every reducer's ``update(layer, view, batch)``. Each primitive is written once per backend:

=====================  ===========================================  ==============================================
view                   maps A (:class:`MapsLayer`)                  q, k, LSE (:class:`~headatlas.core.mapfree.FreeLayer`)
=====================  ===========================================  ==============================================
``target(name)``       A[i, t_i], a gather                          exp(s_it - LSE_i), one dot product per query
``value(name)``        (A m)_i, one product                         the attention pass's widened values
``lower(name)``        sum_{j <= i} A_ij m_j                        the same (an encoder: a second, causal pass)
``entropy()``          -sum_j A_ij ln A_ij                          LSE_i - scale q_i . (A K)_i
``row_sum()``          sum_j A_ij                                   1 (the softmax)
``rows(...)``          a slice of A                                 exp(s_ij - LSE_i) of a block of rows
``query_rows(q)``      rows of A                                    one dot product per (query, key)
``key_mass(pos, w)``   columns of A times w                         the queries against the m gathered keys
=====================  ===========================================  ==============================================

and ``smoothed_entropy`` and ``row_blocks`` are written once here, on ``rows``. Every method returns 0 on
padded query rows and on cells a query may not see; what a view returns is read-only and lives until the next
layer. ``tests/unit/core/test_layer_view.py`` checks that the two backends agree on random maps of every mask
kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP
from .reducer import Needs, ReduceBatch, ReduceError, Reducer, clean_maps, reducer_failure, scratch

ROW_CELLS = 2**22  # cells (B x H x rows x keys) of one block of rows recomputed or read at a time
CHUNK_BYTES = 32 << 20  # float32 maps per chunk of sequences of a per-cell temporary (MapsLayer.entropy)


# --- what reducers declare: targets and columns by name ----------------------------------------------------------


def offset_targets(batch: ReduceBatch, offsets) -> np.ndarray:
    """[B, len(offsets), n] key i + offset of every query i (-1 outside the sequence)."""
    n = batch.n
    idx = np.arange(n)
    t = idx[None, :] + np.asarray(list(offsets), dtype=np.int64)[:, None]  # [T, n]
    ok = (t >= 0) & (t[None] < batch.lengths[:, None, None])
    return np.where(ok, t[None], -1)


def offset_target(batch: ReduceBatch, offset: int) -> np.ndarray:
    """[B, n] key i + offset of every query i (-1 outside the sequence): the target named ``offset:<o>``."""
    return offset_targets(batch, (offset,))[:, 0]


def key_target(batch: ReduceBatch, key: int) -> np.ndarray:
    """[B, n] the same key for every query (the target named ``key:<j>``, e.g. 0: the first token)."""
    return np.full((len(batch), batch.n), key, dtype=np.int64)


def key_positions(batch: ReduceBatch, device):
    """[B, n, 1] float32 key positions 0..n-1 (the value column of mean distances)."""
    import torch

    return torch.arange(batch.n, device=device, dtype=torch.float32)[None, :, None].expand(len(batch), -1, -1)


SUMMARY_GROUPS = ((SPECIAL_CLS, SPECIAL_BOS), (SPECIAL_SEP,))  # the [CLS]/BOS and [SEP] key groups of the reducers


def key_columns(batch: ReduceBatch, groups, device) -> tuple:
    """(positions [B, m], weights [B, m, G]) of each sequence's tokens of any special kind in
    ``groups`` (G tuples of kinds; m = the most such tokens in one sequence, filler weight 0): the attention
    to them is the layer view's ``key_mass`` of m keys, not a pass over the maps."""
    import torch

    def make():
        kinds = sorted({k for g in groups for k in g})
        hit = np.isin(batch.special, kinds)
        m = max(1, int(hit.sum(1).max()) if hit.size else 1)
        rank = np.cumsum(hit, 1) - 1
        pos = np.zeros((len(batch), m), dtype=np.int64)
        w = np.zeros((len(batch), m, len(groups)), dtype=np.float32)
        b, j = np.nonzero(hit)
        pos[b, rank[b, j]] = j
        for g, group in enumerate(groups):
            w[b, rank[b, j], g] = np.isin(batch.special[b, j], list(group))
        return torch.as_tensor(pos, device=device), torch.as_tensor(w, device=device)

    return batch.memo(("key_columns", tuple(tuple(g) for g in groups), str(device)), make)


@dataclass
class LayerPlan:
    """One batch's declarations, merged over its reducers: the entropy, the smoothed entropy's eps, value columns
    [B, n, C] (None: none) and where each name's columns are, lower columns likewise (under a causal mask every
    visible key is j <= i: the lower columns travel with the values, keyed ``("lower", name)``), and the targets
    (name -> [B, n] key of each query, -1: none)."""

    entropy: bool
    smoothing: float | None  # the smoothed entropy's eps (the first reducer's that asks for one)
    values: object
    value_at: dict
    lower: object
    lower_at: dict
    targets: dict

    @classmethod
    def of(cls, reducers: Sequence[Reducer], batch: ReduceBatch, causal: bool, device) -> "LayerPlan":
        """The plan of ``reducers``' declarations on ``batch``."""
        return cls.of_needs([r.layer_needs(batch, causal) for r in reducers], causal, device)

    @classmethod
    def of_needs(cls, needs: Sequence[Needs], causal: bool, device) -> "LayerPlan":
        """The plan of declarations ``needs`` (:class:`~headatlas.core.reducer.Needs`), merged by name."""
        import torch

        def stack(*kinds):
            cols: dict = {}
            for kind in kinds:
                for nd in needs:
                    for name, v in getattr(nd, kind).items():
                        key = name if kind == "values" else (kind, name)
                        cols.setdefault(key, torch.as_tensor(v, dtype=torch.float32, device=device))
            if not cols:
                return None, {}
            at, off = {}, 0
            for name, v in cols.items():
                at[name] = slice(off, off + v.shape[-1])
                off += v.shape[-1]
            return torch.cat(list(cols.values()), -1), at  # [B, n, C]

        targets: dict = {}
        for nd in needs:
            for name, t in nd.targets.items():
                targets.setdefault(name, np.asarray(t, dtype=np.int64))
        low = (None, {}) if causal else stack("lower")
        values = stack("values", "lower") if causal else stack("values")
        smoothing = next((nd.smoothed_entropy for nd in needs if nd.smoothed_entropy is not None), None)
        return cls(any(nd.entropy for nd in needs), smoothing, *values, *low, targets)

    def columns(self, values, lower) -> tuple[dict, dict]:
        """({name: [B, H, n, c]} values, {name: ...} lower) of the passes' stacked results (None: none)."""
        got_values, got_lower = {}, {}
        for name, sl in self.value_at.items():
            if isinstance(name, tuple):
                got_lower[name[1]] = values[..., sl]
            else:
                got_values[name] = values[..., sl]
        for name, sl in self.lower_at.items():
            got_lower[name[1]] = lower[..., sl]
        return got_values, got_lower

    def target_index(self, batch: ReduceBatch, device="cpu"):
        """[B, T, n] int64 every target (in ``targets`` order), or None without."""
        return target_index(batch, self.targets, device) if self.targets else None

    def target_ok(self, batch: ReduceBatch, causal: bool, device="cpu"):
        """[B, T, n] bool: the target is a key of the sequence (at most i under a causal mask) of a real query."""
        return target_ok(batch, self.targets, causal, device)


def target_index(batch: ReduceBatch, targets: dict, device="cpu"):
    """[B, T, n] int64 the key of each query of every target of ``targets`` (name -> [B, n], -1: none), in its
    order (made once per batch)."""
    import torch

    make = lambda: torch.as_tensor(np.stack(list(targets.values()), 1), dtype=torch.int64, device=device)  # noqa: E731
    return batch.memo(("layer_targets", str(device), tuple(targets)), make)


def target_ok(batch: ReduceBatch, targets: dict, causal: bool, device="cpu"):
    """[B, T, n] bool of :func:`target_index`: the target is a key of the sequence (at most i under a causal
    mask) of a real query."""
    import torch

    def ok():
        t = target_index(batch, targets, device)
        length = torch.as_tensor(batch.lengths, device=device)[:, None, None]
        i = torch.arange(batch.n, device=device)
        keep = (t >= 0) & (t < length) & (i < length)
        return keep & (t <= i) if causal else keep

    return batch.memo(("layer_target_ok", str(device), tuple(targets), causal), ok)


def layer_plan(reducers: Sequence[Reducer], batch: ReduceBatch, causal: bool, device) -> LayerPlan:
    """The batch's :class:`LayerPlan` for ``reducers`` on ``device`` (made once per batch: kept on it)."""
    key = ("layer_plan", causal, str(device), tuple(id(r) for r in reducers))
    return batch.memo(key, lambda: LayerPlan.of(reducers, batch, causal, device))


# --- the view ----------------------------------------------------------------------------------------------------


class LayerView:
    """One layer of one batch as reducers read it (module docstring): ``batch``, ``causal``, ``valid`` [B, n]
    real queries, ``shape`` (B, H, n), ``device``; the primitives each backend implements, and the two written
    here on :meth:`rows`."""

    batch: ReduceBatch
    causal: bool
    valid: object

    @property
    def shape(self) -> tuple[int, int, int]:
        raise NotImplementedError

    @property
    def device(self):
        raise NotImplementedError

    def target(self, name: str):
        """[B, H, n] attention of each query to its key of a declared target (0 where it has none)."""
        raise NotImplementedError

    def value(self, name: str):
        """[B, H, n, c] (A m)_i of a declared value column."""
        raise NotImplementedError

    def lower(self, name: str):
        """[B, H, n, c] sum_{j <= i} A_ij m_j of a declared lower column."""
        raise NotImplementedError

    def entropy(self):
        """[B, H, n] row entropy -sum_j A_ij ln A_ij in nats (declared: ``Needs.entropy``)."""
        raise NotImplementedError

    def row_sum(self):
        """[B, H, n] sum_j A_ij: 1 on real rows map-free (the kernel's softmax), the maps' own sums (stored maps:
        within their storage dtype's rounding of 1), 0 on padded rows."""
        raise NotImplementedError

    def rows(self, lo: int = 0, hi: int | None = None, seqs=None, keys: int | None = None, slot: str | None = None):
        """[b, H, hi - lo, keys] float32 attention rows lo..hi-1 of the sequences ``seqs`` (batch indices; None:
        all) on keys 0..keys-1 (None: all n), 0 on the cells a query may not see. ``slot``: in that
        :func:`~headatlas.core.reducer.scratch` buffer (valid until the slot is asked for again); without one,
        a tensor of its own that the caller may keep."""
        raise NotImplementedError

    def query_rows(self, query):
        """[B, H, P, n] rows of the queries ``query`` [B, P] (token index, -1: none; 0 there)."""
        raise NotImplementedError

    def key_mass(self, pos, w, cells: int = ROW_CELLS):
        """[B, H, n, G] sum_t w[b, t, g] A[b, h, i, pos[b, t]]: the attention of every query to a few fixed keys
        per sequence (``pos`` [B, m] key indices, ``w`` [B, m, G] weights) summed in groups; keys in chunks of
        about ``cells`` cells."""
        raise NotImplementedError

    def row_blocks(self, cells: int = ROW_CELLS):
        """(slice of queries, :meth:`rows` of every sequence for them) in blocks of at most about ``cells``
        cells, read-only and valid until the next block. Under a causal mask a block of rows lo..hi-1 holds keys
        0..hi-1 only (every later key is 0 in those rows): about half the cells of a long input."""
        bsz, h, n = self.shape
        step = max(1, cells // max(1, bsz * h * n))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            yield slice(lo, hi), self.rows(lo, hi, keys=hi if self.causal else None, slot="row_blocks")

    def smoothed_entropy(self, eps: float, cells: int = ROW_CELLS):
        """[B, H, n] float32 entropies of the smoothed rows P = (1 - eps) A + eps / k_i over each row's k_i
        visible keys (Clark et al.'s; no LSE identity gives them), 0 on padded rows, from the rows in blocks
        (:meth:`row_blocks`): cells a row may not see hold A = 0, so P = eps / k_i there, and their -P ln P is
        taken back out by count, not by a mask."""
        import torch

        dev = self.device
        bsz, h, n = self.shape
        k = self.batch.keys_per_row(dev, self.causal)  # [B, n] float64
        c = (eps / k).float()[:, None, :, None]  # [B, 1, n, 1] eps / k_i
        clogc = (eps / k) * torch.log(eps / k)  # [B, n] float64
        out = torch.empty((bsz, h, n), dtype=torch.float32, device=dev)
        for rows, a in self.row_blocks(cells):
            p = torch.add(c[:, :, rows], a, alpha=1 - eps, out=scratch("smoothed_p", a.shape, dev))
            plp = torch.log(p, out=scratch("smoothed_log", p.shape, dev)).mul_(p).sum(-1)  # sum_j P ln P
            outside = (a.shape[-1] - k[:, rows]) * clogc[:, rows]  # [B, rows]: what the unseen cells added
            out[:, :, rows] = outside[:, None].float() - plp
        return torch.where(self.valid[:, None], out, 0.0)


class MapsLayer(LayerView):
    """The view of one layer's maps ``attn`` [B, H, n, n] (eager or replayed; :func:`clean_maps` masks every
    cell a real query may not see), with the batch's :class:`LayerPlan`. ``maps`` is the feed's tensor as it
    came (for reducers that keep maps: copy what is kept)."""

    def __init__(self, attn, batch: ReduceBatch, causal: bool, plan: LayerPlan):
        self.maps, self.batch, self.causal, self.plan = attn, batch, causal, plan
        self.valid = batch.masks(attn.device, causal)["valid"]
        self._a = self._targets = self._values = self._lower = self._entropy = None

    @property
    def a(self):
        """The maps as float32 with every cell a real query may not see set to 0 (:func:`clean_maps`, made on
        first use: a reducer that only keeps the maps needs no copy); read-only."""
        if self._a is None:
            self._a = clean_maps(self.maps, self.batch, self.causal)
        return self._a

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.maps.shape[:3])

    @property
    def device(self):
        return self.maps.device

    def target(self, name: str):
        if self._targets is None:  # every declared target in one gather
            t = self.plan.target_index(self.batch, self.device)  # [B, T, n]
            bsz, h, n, _ = self.a.shape
            index = t.clamp(0, max(0, n - 1)).transpose(1, 2)[:, None].expand(bsz, h, n, t.shape[1])
            ok = self.plan.target_ok(self.batch, self.causal, self.device).transpose(1, 2)[:, None]
            got = self.a.gather(3, index) * ok  # [B, H, n, T]
            self._targets = {name: got[..., i] for i, name in enumerate(self.plan.targets)}
        return self._targets[name]

    def _columns(self):
        import torch

        if self._values is None:
            p = self.plan
            vals = None if p.values is None else torch.matmul(self.a, p.values.to(self.device)[:, None])
            low = None
            if p.lower is not None:  # an encoder's keys j <= i
                tril = self.batch.memo(
                    ("tril", str(self.device), self.batch.n),
                    lambda: torch.ones(self.batch.n, self.batch.n, device=self.device).tril_(),
                )
                below = torch.mul(self.a, tril, out=scratch("maps_lower", self.a.shape, self.device))
                low = torch.matmul(below, p.lower.to(self.device)[:, None])
            self._values, self._lower = p.columns(vals, low)
        return self._values, self._lower

    def value(self, name: str):
        return self._columns()[0][name]

    def lower(self, name: str):
        return self._columns()[1][name]

    def entropy(self):
        import torch

        if self._entropy is None:  # once per layer, however many reducers read it (read-only)
            bsz, h, n, _ = self.a.shape
            step = max(1, CHUNK_BYTES // max(1, 4 * h * n * n))  # sequences per chunk: the temporary stays small
            self._entropy = torch.cat([torch.special.entr(self.a[i : i + step]).sum(-1) for i in range(0, bsz, step)])
        return self._entropy

    def row_sum(self):
        return self.a.sum(-1)

    def rows(self, lo: int = 0, hi: int | None = None, seqs=None, keys: int | None = None, slot: str | None = None):
        import torch

        a = self.a[:, :, lo:hi, :keys]
        if seqs is not None:
            a = a[torch.as_tensor(np.asarray(seqs, dtype=np.int64), device=self.device)]
        if slot is not None:
            return scratch(slot, a.shape, self.device).copy_(a)
        return a.clone() if seqs is None else a

    def row_blocks(self, cells: int = ROW_CELLS):
        """The blocks of :meth:`LayerView.row_blocks` as slices of the maps (no copy)."""
        bsz, h, n = self.shape
        step = max(1, cells // max(1, bsz * h * n))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            yield slice(lo, hi), self.a[:, :, lo:hi, : (hi if self.causal else n)]

    def query_rows(self, query):
        import torch

        qi = torch.as_tensor(np.asarray(query, dtype=np.int64), device=self.device)  # [B, P]
        bsz, h, n, _ = self.a.shape
        got = self.a.gather(2, qi.clamp(min=0)[:, None, :, None].expand(bsz, h, qi.shape[1], n))
        return got * (qi >= 0)[:, None, :, None]

    def key_mass(self, pos, w, cells: int = ROW_CELLS):
        import torch

        bsz, h, n, _ = self.a.shape
        m = pos.shape[1]
        w = w * (pos < self.batch.tensor("lengths", pos.device)[:, None])[..., None]  # keys inside the sequence
        out = torch.zeros((bsz, h, n, w.shape[-1]), dtype=torch.float32, device=self.device)
        step = max(1, cells // max(1, bsz * h * n))
        for lo in range(0, m, step):
            p = pos[:, lo : lo + step].clamp(max=max(0, n - 1))
            cols = self.a.gather(3, p[:, None, None, :].expand(bsz, h, n, p.shape[1]))
            out += torch.matmul(cols, w[:, None, lo : lo + step])
        return out


def feed_layer(reducers: Sequence[Reducer], info, layer: int, attn, batch: ReduceBatch) -> None:
    """Hand one layer's [B, H, n, n] maps to every reducer as a :class:`MapsLayer` (the eager and replay feeds)."""
    view = MapsLayer(attn, batch, info.causal, layer_plan(reducers, batch, info.causal, attn.device))
    for r in reducers:
        try:
            r.update(layer, view, batch)
        except ReduceError:
            raise
        except Exception as e:
            raise reducer_failure(r, info, batch, layer, e) from e
