"""Pande et al.'s sentence scores as a reducer (:mod:`headatlas.core.reduce`): the same arrays as
``score_store`` (tests/reference/sieves.py), computed in torch on a padded batch, on the device where the
attention is (sums over cells in float32 like the reference, the rest in float64). Only the scores [B, H, roles]
of each layer go to the host.

Roles come by name from the registry (:data:`headatlas.pande.roles.ROLES`): each token role (a band of offsets,
special keys, the block) has a [B, n] sieve size per query built once per batch and one [B, H, n] mass per layer,
kept in a dict under the role's name. Each layer is read through its
:class:`~headatlas.core.layer_view.LayerView` (:meth:`_BatchSieves.sums`; maps or q, k and LSE): a band = its
offset targets; special keys ([CLS]/BOS, [SEP]) = the view's mass on those keys (:func:`view_key_masses`); block
= two value columns (content tokens of segment A, of segment B) picked by the query's segment, and A ln A summed
= -entropy; syntactic = one target per (query piece, key piece) of a pair, summed over the key word's pieces. No
Python loop over cells, rows, heads or pairs; the only loop over the sequences of a batch builds their
dependency pairs from the corpus records (Python objects), once per batch.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..core.data import SPECIAL_NONE
from ..core.layer_view import SUMMARY_GROUPS, key_columns, offset_target
from ..core.reducer import Needs, ReduceBatch, ReduceError, Reducer, check_layers_done, stack_layers
from .roles import ROLES, Band, Block, Keys, Role, check_registry, key_groups, role_names, token_roles
from .sieves import SieveSettings, dependency_pairs, query_segment, role_notes

DIRECTION_ENDS = {"dep_to_head": [(0, 1)], "head_to_dep": [(1, 0)], "both": [(0, 1), (1, 0)]}


class _BatchSieves:
    """The layer-independent part of a batch: sieve masks, counts, dependency pairs (on the device)."""

    def __init__(
        self, batch: ReduceBatch, settings: SieveSettings, causal: bool, device, registry: dict[str, Role] = ROLES
    ):
        import torch

        check_registry(registry)
        self.batch = batch
        self.token = token_roles(registry)  # name -> Role of the roles scored per query token, in column order
        self.key_groups = key_groups(registry)
        m = batch.masks(device, causal)
        valid, cell, allowed, content = m["valid"], m["cell"], m["allowed"], m["content"]
        self.cell, self.allowed = cell, allowed
        bsz, n = valid.shape
        lengths = batch.tensor("lengths", device)
        idx = torch.arange(n, device=device)
        self.k = ((idx + 1)[None, :].expand(bsz, n) if causal else lengths[:, None].expand(bsz, n)).double()
        diff = idx[None, :] - idx[:, None]  # key - query
        special = batch.tensor("special", device)
        segment = batch.tensor("segment", device)
        self.is_pair = (content & (segment == 1)).any(1)  # [B]
        # a special token takes the segment of the next content token of its sequence (sieves.query_segment)
        flat_special = np.concatenate([batch.special[b, :l] for b, l in enumerate(batch.lengths)])
        flat_segment = np.concatenate([batch.segment[b, :l] for b, l in enumerate(batch.lengths)])
        starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
        qseg_flat = query_segment(flat_special, flat_segment, starts)
        qseg = np.full((bsz, n), -1, dtype=np.int64)
        qseg[batch.special != -1] = qseg_flat  # row-major order of the real tokens = concatenation order
        qseg = self.qseg = torch.as_tensor(qseg, device=device)
        # the block is scored on batches with a pair only
        has_block = any(isinstance(r.sieve, Block) for r in self.token.values())
        self.any_block = has_block and bool(self.is_pair.any())
        cnt = {}  # role -> [B, n] sieve size of each query
        for name, role in self.token.items():
            sieve = role.sieve
            if isinstance(sieve, Band):
                offs = sieve.keys(settings.window, causal)
                offs = torch.tensor(offs, device=device, dtype=idx.dtype)
                mask = cell & torch.isin(diff, offs)[None]
            elif isinstance(sieve, Keys):
                kinds = torch.tensor([k for g in sieve.groups for k in g], device=device, dtype=special.dtype)
                mask = allowed & torch.isin(special, kinds)[:, None, :]
            elif isinstance(sieve, Block):
                mask = allowed & content[:, None, :] & (segment[:, None, :] == qseg[:, :, None])
                mask &= self.is_pair[:, None, None]
            else:  # pragma: no cover (check_registry)
                raise ValueError(f"Pande role {name}: unknown sieve {sieve!r}")
            cnt[name] = mask.sum(-1).double()
        self.causal = causal
        self.cnt = torch.stack(list(cnt.values()))  # [R, B, n], R token roles in registry order
        self.use = (self.cnt > 0) & valid[None]
        self.use_count = self.use.sum(-1).double()  # [R, B]
        # per layer, a role's sentence score is sum_i b_i * use_w_i (+ NaN where no query has the sieve)
        self.inv_cnt = (1.0 / self.cnt.clamp(min=1))[:, :, None, :]  # [R, B, 1, n]
        self.use_w = (self.use.double() / self.use_count.clamp(min=1)[:, :, None])[:, :, None, :]  # [R, B, 1, n]
        self.no_query = torch.where(self.use_count > 0, 0.0, math.nan)[:, :, None]  # [R, B, 1]
        self.pad_rows = (~valid).double()[:, None, :]  # [B, 1, n]: 1 on padded rows, so their scale stays finite
        self.done: dict = {}  # layer -> sums (SieveReducer.update)
        self._pairs(batch, settings, device)

    def _pairs(self, batch: ReduceBatch, settings: SieveSettings, device) -> None:
        import torch

        n_rel = len(settings.relations)
        self.pairs_present = np.zeros(n_rel + 1, dtype=np.int64)
        self.has_trees = np.zeros(len(batch), dtype=bool)
        pb, pd, ph, pr = [], [], [], []
        if batch.records is not None:
            for b, r in enumerate(batch.records):  # Python records: one pass per batch, not per layer
                self.has_trees[b] = bool(r.head)
                dep, head, rel = dependency_pairs(r.head, r.deprel, settings, int(batch.n_words[b]))
                self.pairs_present += np.bincount(rel, minlength=n_rel + 1)
                self.pairs_present[-1] += len(rel)
                pb.append(np.full(len(dep), b))
                pd.append(dep)
                ph.append(head)
                pr.append(rel)
        cat = lambda xs: torch.as_tensor(
            np.concatenate(xs) if xs else np.zeros(0, np.int64), dtype=torch.int64, device=device
        )  # noqa: E731
        self.pb, self.pr = cat(pb), cat(pr)
        ends = (cat(pd), cat(ph))
        self.n_pairs = len(self.pb)
        ws = torch.where(batch.masks(device, False)["content"], batch.tensor("word", device), -1)
        self.groups = []
        if not self.n_pairs:
            return
        for qi, ki in DIRECTION_ENDS[settings.direction]:
            q = ws[self.pb] == ends[qi][:, None]  # [P, n] query pieces of each pair
            key = ws[self.pb] == ends[ki][:, None]  # [P, n] key pieces
            p_idx, row = torch.nonzero(q, as_tuple=True)  # one group per (pair, query piece)
            b_idx = self.pb[p_idx]
            sieve = key[p_idx] & self.allowed[b_idx, row]  # [G, n] visible key pieces
            cnt = sieve.sum(-1).double()
            use = cnt > 0
            # per pair: query pieces that score it (layer-independent)
            c = torch.zeros(self.n_pairs, dtype=torch.float64, device=device).index_add_(0, p_idx, use.double())
            self.groups.append(
                {"pair": p_idx, "b": b_idx, "row": row, "sieve": sieve.float(), "cnt": cnt, "use": use, "c": c}
            )
        # which pairs a direction scores, and the pairs per (sequence, relation) and per sequence: layer-independent
        if len(self.groups) == 1:
            self.live = self.groups[0]["c"] > 0
        else:
            l0, l1 = (g["c"] > 0 for g in self.groups)
            self.live, self.k_dir = l0 | l1, l0.double() + l1.double()
        n_rel = len(settings.relations)
        w = self.live.double()
        key = self.pb * (n_rel + 1)
        self.rel_keys = (key + n_rel, key + self.pr)  # union, then per relation
        self.rel_count = [
            torch.zeros(len(batch) * (n_rel + 1), dtype=torch.float64, device=device).index_add_(0, k, w)
            for k in self.rel_keys
        ]

    def _key_mass(self, role: Role, km):
        """A special-keys role's [B, H, n] mass: its groups' columns of ``km`` [B, H, n, G] added in order."""
        cols = [km[..., self.key_groups.index(tuple(g))] for g in role.sieve.groups]
        return sum(cols[1:], cols[0])

    def needs(self, settings: SieveSettings):
        """What :meth:`sums` reads (:class:`~headatlas.core.reducer.Needs`): targets only (the bands' offsets, the
        pairs' key pieces; the special keys are a product with their keys, no pass), and for batches with a pair
        the segments' value columns (+ the entropy with ``block_entropy``)."""
        batch = self.batch
        offsets = [
            o
            for r in self.token.values()
            if isinstance(r.sieve, Band)
            for o in r.sieve.keys(settings.window, self.causal)
        ]
        targets = {f"offset:{o}": offset_target(batch, o) for o in dict.fromkeys(offsets)}
        arcs = self.arc_targets()
        targets |= {arc_name(settings, t): arcs[:, t].cpu().numpy() for t in range(arcs.shape[1])}
        values = {}
        if self.any_block:
            seg, content = batch.segment, batch.special == SPECIAL_NONE
            values["segment_content"] = np.stack([content & (seg == s) for s in (0, 1)], -1).astype(np.float32)
        return Needs(entropy=self.any_block and settings.block_entropy, values=values, targets=targets)

    def sums(self, view, settings: SieveSettings) -> dict:
        """One layer's sums from its :class:`~headatlas.core.layer_view.LayerView` given :meth:`needs`, by name:
        ``rowsum`` [B, H, n], each token role's [B, H, n] mass under its own name (the block: None without a pair
        in the batch), ``xlogx`` (the block's sum of A ln A, or None) and ``arcs:<d>`` ([G, H] sieve sums of
        direction d's groups); :meth:`from_sums` turns them into the scores."""
        import torch

        bsz, h, n = view.shape
        out = {"rowsum": view.row_sum()}
        km = view_key_masses(view, self.batch, self.key_groups) if self.key_groups else None
        for name, role in self.token.items():
            if isinstance(role.sieve, Band):
                offs = role.sieve.keys(settings.window, self.causal)  # none: a band cut away by the causal mask
                out[name] = sum(view.target(f"offset:{o}") for o in offs) if offs else out["rowsum"] * 0
            elif isinstance(role.sieve, Keys):
                out[name] = self._key_mass(role, km)
            else:  # the mass on the content tokens of the query's segment (used on pairs only)
                out[name] = None
                if self.any_block:
                    seg = view.value("segment_content")  # [B, H, n, 2]
                    out[name] = seg.gather(3, self.qseg.clamp(min=0)[:, None, :, None].expand(bsz, h, n, 1))[..., 0]
        out["xlogx"] = None
        if self.any_block and settings.block_entropy:
            out["xlogx"] = -view.entropy()  # sum_j A ln A of a row summing to 1
        if self.groups:
            arcs = self.arc_targets()
            n_t = arcs.shape[1]
            at = torch.stack([view.target(arc_name(settings, t)) for t in range(n_t)], 2) if n_t else None
            for d, (g, (flat, gi)) in enumerate(zip(self.groups, self.arc_entries())):
                gs = torch.zeros((len(g["b"]), h), dtype=torch.float32, device=view.device)
                if n_t and len(flat):  # each entry's value at (b, :, slot, row), added to its group
                    vals = at.permute(0, 2, 3, 1).reshape(-1, h).index_select(0, flat)
                    gs.index_add_(0, gi, vals)
                out[f"arcs:{d}"] = gs
        return out

    def arc_targets(self):
        """[B, T, n] int64: per query piece the key pieces of its pairs' sieves, one per slot t (-1: none), for
        every direction; :meth:`arc_entries` says which slot goes to which group."""
        self._arcs()
        return self._arc_cache[0]

    def arc_entries(self) -> list:
        """Per direction's groups: (flat index (b * T + slot) * n + row of each (group, key piece) entry in the
        [B, T, n] targets, the entry's group)."""
        self._arcs()
        return self._arc_cache[1]

    def _arcs(self) -> None:
        import torch

        if getattr(self, "_arc_cache", None) is not None:
            return
        bsz, n = self.batch.special.shape
        dev = self.allowed.device
        parts = []
        for g in self.groups:
            gi, key = torch.nonzero(g["sieve"] > 0, as_tuple=True)  # entries (group, visible key piece)
            parts.append((gi, key, g["b"][gi], g["row"][gi]))
        if not parts or not sum(len(p[0]) for p in parts):
            empty = torch.zeros(0, dtype=torch.int64, device=dev)
            self._arc_cache = (
                torch.full((bsz, 0, n), -1, dtype=torch.int64, device=dev),
                [(empty, empty)] * len(parts),
            )
            return
        key, b, row = (torch.cat([p[i] for p in parts]) for i in (1, 2, 3))
        e = len(key)
        q = b * n + row  # entries of one query piece take slots 0, 1, ... in order
        order = torch.argsort(q, stable=True)
        sq = q[order]
        first = torch.ones(e, dtype=torch.bool, device=dev)
        first[1:] = sq[1:] != sq[:-1]
        pos = torch.arange(e, device=dev)
        start = torch.cummax(torch.where(first, pos, 0), 0).values
        slot = torch.empty_like(pos)
        slot[order] = pos - start
        n_t = int(slot.max()) + 1
        targets = torch.full((bsz, n_t, n), -1, dtype=torch.int64, device=dev)
        targets[b, slot, row] = key
        flat = (b * n_t + slot) * n + row
        entries, at = [], 0
        for gi, *_ in parts:
            entries.append((flat[at : at + len(gi)], gi))
            at += len(gi)
        self._arc_cache = (targets, entries)

    def from_sums(self, sums: dict, settings: SieveSettings) -> "torch.Tensor":  # noqa: F821
        """[L, B, H, roles] float64 scores from :meth:`sums` stacked over L layers in a leading axis: the
        float64 operations of every layer of the batch at once (a fixed number of small operations per batch
        instead of per layer; the same values as layer by layer). Columns: :func:`~headatlas.pande.roles.role_names`."""
        import torch

        rowsum, xlogx = sums["rowsum"], sums["xlogx"]
        n_layers, bsz, h, n = rowsum.shape
        n_tok, n_rel = len(self.token), len(settings.relations)
        dev = rowsum.device
        out = torch.full((n_layers, bsz, h, n_tok + 1 + n_rel), math.nan, dtype=torch.float64, device=dev)
        rs = rowsum.double() + self.pad_rows  # [L, B, H, n]
        scale = self.k[:, None, :] / rs  # a real row summing to 0 gives inf -> NaN, as the reference
        zero = rowsum.new_zeros(()).expand_as(rowsum)  # a block without a pair in the batch
        mass = torch.stack([zero if sums[r] is None else sums[r] for r in self.token]).double()  # [R, L, B, H, n]
        b = mass * self.inv_cnt[:, None] * scale[None]
        if xlogx is not None:
            for r, role in enumerate(self.token.values()):
                if isinstance(role.sieve, Block):  # entropy (nats) of the renormalised row
                    b[r] = b[r] * (torch.log(rs) - xlogx.double() / rs)
        out[..., :n_tok] = ((b * self.use_w[:, None]).sum(-1) + self.no_query[:, None]).permute(1, 2, 3, 0)
        if not self.groups:
            return out
        per_dir = []
        for d, g in enumerate(self.groups):
            gs = sums[f"arcs:{d}"]
            flat = self._flat_rows(g, h, n)
            m = (
                gs.double()
                / g["cnt"][:, None]
                * scale.reshape(n_layers, -1).index_select(1, flat).view(n_layers, -1, h)
            )
            s = torch.zeros((n_layers, self.n_pairs, h), dtype=torch.float64, device=dev).index_add_(
                1, g["pair"], torch.where(g["use"][:, None], m, 0.0)
            )  # [L, P, H]
            per_dir.append(s / g["c"].clamp(min=1)[:, None])
        if len(per_dir) == 1:
            ps = per_dir[0]
        else:  # the mean of the directions that score the pair (sieves._nanmean2)
            (s0, s1), (g0, g1) = per_dir, self.groups
            ps = (torch.where((g0["c"] > 0)[:, None], s0, 0.0) + torch.where((g1["c"] > 0)[:, None], s1, 0.0)) / (
                self.k_dir.clamp(min=1)[:, None]
            )
        live = self.live
        for col, keys, c in zip((None, "rel"), self.rel_keys, self.rel_count):  # union, then per relation
            s = torch.zeros((n_layers, bsz * (n_rel + 1), h), dtype=torch.float64, device=dev).index_add_(
                1, keys, torch.where(live[:, None], ps, 0.0)
            )
            mean = torch.where(c[:, None] > 0, s / c.clamp(min=1)[:, None], math.nan).reshape(
                n_layers, bsz, n_rel + 1, h
            )
            if col is None:
                out[..., n_tok] = mean[:, :, n_rel]
            else:
                out[..., n_tok + 1 :] = mean[:, :, :n_rel].permute(0, 1, 3, 2)
        return out

    @staticmethod
    def _flat_rows(g: dict, h: int, n: int):
        """[G * H] indices of the rows (b, head, row) of group ``g`` in maps flattened to [B * H * n, n]: one
        contiguous row copy per index (an advanced index a[b, :, row] is several times slower on a CPU)."""
        import torch

        key = ("flat", h, n)
        if key not in g:
            heads = torch.arange(h, device=g["b"].device)
            g[key] = ((g["b"][:, None] * h + heads[None, :]) * n + g["row"][:, None]).reshape(-1)
        return g[key]

    def pair_counts(self, n_rel: int) -> np.ndarray:
        """[B, n_rel + 1] pairs scored per relation, then their union."""
        counts = np.zeros((len(self.batch), n_rel + 1), dtype=np.int64)
        if self.n_pairs:
            live = self.live.cpu().numpy()
            np.add.at(counts, (self.pb.cpu().numpy()[live], self.pr.cpu().numpy()[live]), 1)
        counts[:, n_rel] = counts[:, :n_rel].sum(1)
        return counts


def view_key_masses(view, batch: ReduceBatch, groups=SUMMARY_GROUPS):
    """[B, H, n, G] attention of each query to the tokens of each group of special kinds
    (:meth:`~headatlas.core.layer_view.LayerView.key_mass` of the :func:`~headatlas.core.layer_view.key_columns`)."""
    return view.key_mass(*key_columns(batch, groups, view.device))


def arc_name(settings: SieveSettings, slot: int) -> str:
    """The name of a pair target slot of the sieves with ``settings`` (their relations, labels and direction)."""
    import hashlib

    p = _settings_params(settings)
    sig = hashlib.sha1(json.dumps([p["relations"], p["labels"], p["direction"]]).encode()).hexdigest()[:10]
    return f"pande_arc:{sig}:{slot}"


class SieveReducer(Reducer):
    """Pande's sentence scores for every role: ``result()`` is ``score_store`` (tests/reference/sieves.py)'s
    dict (scores [N, L, H, R] float32, pair_counts, pairs_present, roles, relations, record_id, is_pair, notes).
    The feed must be given the corpus ``records`` for syntactic roles (gold trees or a parse). ``registry``: the
    roles by name (:data:`headatlas.pande.roles.ROLES`; a copy with other roles in tests)."""

    name = "pande_sieves"
    analysis = "pande"
    needs_records = True

    def __init__(
        self, settings: SieveSettings | None = None, flush_every: int = 256, registry: dict[str, Role] = ROLES
    ):
        check_registry(registry)
        self.settings = settings or SieveSettings()
        self.flush_every = flush_every  # (batch, layer) results kept on the device before one copy to the host
        self.registry = registry

    def start(self, info) -> None:
        super().start(info)
        n_rel = len(self.settings.relations)
        self.roles = role_names(self.settings.relations, self.registry)
        self.scores = np.full(
            (info.n_sequences, info.n_layers, info.n_heads, len(self.roles)), np.nan, dtype=np.float32
        )
        self.pair_counts = np.zeros((info.n_sequences, n_rel + 1), dtype=np.int64)
        self.pairs_present = np.zeros(n_rel + 1, dtype=np.int64)
        self.is_pair = np.zeros(info.n_sequences, dtype=bool)
        self.has_trees = np.zeros(info.n_sequences, dtype=bool)
        self._pending: list = []
        self.open = 0  # batches whose layers have not all come yet

    def layer_needs(self, batch: ReduceBatch, causal: bool):
        return self._plan(batch, "cpu").needs(self.settings)

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        plan = self._plan(batch, view.device)
        self._add(layer, plan, plan.sums(view, self.settings), batch)

    def _plan(self, batch: ReduceBatch, device) -> _BatchSieves:
        """The batch's layer-independent work, once per batch and device (kept with the batch: replay
        interleaves batches)."""
        key = ("pande_sieves", id(self), str(device))
        return batch.memo(key, lambda: _BatchSieves(batch, self.settings, self.info.causal, device, self.registry))

    def _add(self, layer: int, plan: _BatchSieves, sums: dict, batch: ReduceBatch) -> None:
        """One layer's sums; the scores of all the batch's layers at once after its last."""
        if layer == 0:
            self.is_pair[batch.seq] = plan.is_pair.cpu().numpy()
            self.has_trees[batch.seq] = plan.has_trees
            self.pairs_present += plan.pairs_present
            if plan.n_pairs:
                self.pair_counts[batch.seq] = plan.pair_counts(len(self.settings.relations))
        if not plan.done:
            self.open += 1
        plan.done[layer] = sums
        if len(plan.done) < self.info.n_layers:
            return
        self.open -= 1
        names = list(sums)  # the same names on every layer of the batch
        layers, stacked = stack_layers({lay: tuple(d[k] for k in names) for lay, d in plan.done.items()})
        sums = dict(zip(names, stacked))
        plan.done = {}
        # scores stay on the device until a flush, so a GPU is not made to wait for the host after every layer
        self._pending.append((batch.seq, layers, plan.from_sums(sums, self.settings).float()))
        if len(self._pending) * len(layers) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        for seq, layers, scores in self._pending:  # scores [L, B, H, R]
            self.scores[seq[:, None], np.asarray(layers)[None, :]] = scores.transpose(0, 1).cpu().numpy()
        self._pending = []

    def params(self) -> dict:
        return _settings_params(self.settings)

    @classmethod
    def from_params(cls, params: dict) -> "SieveReducer":
        return cls(_settings_from_params(params))

    def to_arrays(self, result: dict) -> dict:
        out = {
            k: np.asarray(result[k])
            for k in ("scores", "pair_counts", "pairs_present", "record_id", "is_pair", "has_trees")
        }
        out["roles"] = np.array(result["roles"], dtype=str)
        out["relations"] = np.array(result["relations"], dtype=str)
        out["model_kind"] = np.array([result["model_kind"]])
        out["corpus"] = np.array([result["corpus"]])
        out["settings"] = np.array([json.dumps(_settings_params(result["settings"]), sort_keys=True)])
        return out

    @classmethod
    def from_arrays(cls, arrays: dict) -> dict:
        out = {k: arrays[k] for k in ("scores", "pair_counts", "pairs_present", "is_pair", "has_trees")}
        out["record_id"] = np.asarray(arrays["record_id"]).astype(str)
        out["roles"] = [str(x) for x in arrays["roles"]]
        out["relations"] = [str(x) for x in arrays["relations"]]
        if out["roles"] != role_names(out["relations"]):  # the params do not name the roles: a store of an old registry
            raise ReduceError(
                f"{cls.name}: reduced with roles {out['roles']}, the registry (pande/roles.py) has "
                f"{role_names(out['relations'])}; rerun the extraction of that corpus (delete its store directory "
                "and rerun snakemake)"
            )
        out["model_kind"], out["corpus"] = str(arrays["model_kind"][0]), str(arrays["corpus"][0])
        out["settings"] = _settings_from_params(json.loads(str(arrays["settings"][0])))
        out["notes"] = _notes(out)
        return out

    @classmethod
    def combine(cls, parts: list) -> dict:
        first = parts[0]
        for p in parts[1:]:
            if p["roles"] != first["roles"] or p["scores"].shape[1:] != first["scores"].shape[1:]:
                raise ReduceError(f"{cls.name}: shards with other roles or heads ({p['roles']} vs {first['roles']})")
        out = dict(first)
        for k in ("scores", "pair_counts", "record_id", "is_pair", "has_trees"):
            out[k] = np.concatenate([p[k] for p in parts])
        out["pairs_present"] = sum(p["pairs_present"] for p in parts)
        out["notes"] = _notes(out)
        return out

    def result(self) -> dict:
        check_layers_done(self, self.open)
        self._flush()
        info = self.info
        return {
            "scores": self.scores,
            "pair_counts": self.pair_counts,
            "pairs_present": self.pairs_present,
            "roles": self.roles,
            "relations": list(self.settings.relations),
            "record_id": np.asarray(info.record_id).astype(str)
            if info.record_id is not None
            else np.arange(info.n_sequences).astype(str),
            "is_pair": self.is_pair,
            "has_trees": self.has_trees,
            "model_kind": info.model_kind,
            "corpus": info.corpus or "?",
            "settings": self.settings,
            "notes": role_notes(
                self.scores,
                self.roles,
                self.has_trees,
                self.pairs_present,
                self.settings,
                info.corpus or "?",
                info.model_kind,
                self.registry,
            ),
        }


def _notes(result: dict) -> dict:
    return role_notes(
        result["scores"], result["roles"], result["has_trees"], result["pairs_present"], result["settings"],
        result["corpus"], result["model_kind"],
    )  # fmt: skip


def _settings_params(s: SieveSettings) -> dict:
    return {
        "window": int(s.window),
        "relations": list(s.relations),
        "labels": {k: list(v) for k, v in sorted(s.labels.items())},
        "direction": s.direction,
        "block_entropy": bool(s.block_entropy),
    }


def _settings_from_params(p: dict) -> SieveSettings:
    return SieveSettings(
        window=int(p["window"]),
        relations=tuple(p["relations"]),
        labels={k: tuple(v) for k, v in p["labels"].items()},
        direction=p["direction"],
        block_entropy=bool(p["block_entropy"]),
    )


def fused_plan(section: dict, corpus: str) -> list[Reducer]:
    """The reducers analysis pande needs on ``corpus`` (its validated config section): the sieve scores."""
    if corpus not in (section.get("corpora") or []):
        return []
    return [SieveReducer(SieveSettings.pick(section))]
