"""Head ablation at the attention output projection: a forward pre-hook replaces a head's slice
of the projection's input (the head-major concat of its context vectors) at every position.

Three ways to run it:

- ``ablated(mask, values)``: the same heads ablated in every row of the batch (roles, pruning);
- ``batched(heads, values, rows)``: one block of ``rows`` batch rows per ablated head, so that one
  forward pass ablates many single heads. With ``expand=True`` the batch is expanded inside the
  model: a pre-hook on each transformer layer appends a copy of the intact rows for every head
  of that layer, so the layers before a head run once on the intact rows only (about half the
  work of replicating the inputs for every head); the intact rows are dropped after the last
  layer that needs them. With ``expand=False`` the caller replicates the inputs instead;
- ``layer_paths(layers, alpha, values, rows)``: one block per layer of ``layers`` in which every head
  of that layer is moved the share ``alpha`` of the way from its intact vector to its replacement,
  as a leaf tensor for the gradient (integrated gradients along each layer's own path).

``values`` is a :class:`Replacement`: per layer and head a vector (mean, zero) or, per batch row
and position, another sequence's output of the head (resample).
A model whose layers share weights (ALBERT) has one module per group; the hooks count calls.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..core.extract import head_output_pattern

MODES = ("mean", "zero", "resample")


@dataclass
class Replacement:
    """What an ablated head's context vector becomes.

    ``vectors`` [L, H, d] (mode mean or zero), or for ``resample`` ``per_sequence`` [S, L, n, H, d]:
    sequence s takes sequence ``donor[s]``'s output of the head at the same position (positions
    past the donor's end take the donor's mean over its real tokens)."""

    mode: str
    vectors: np.ndarray | None = None
    per_sequence: np.ndarray | None = None
    donor: np.ndarray | None = None

    def for_batch(self, pos: np.ndarray, n: int):
        """A tensor [L, H, d] or [L, B, n, H, d] for the batch of sequences ``pos`` padded to ``n``."""
        import torch

        if self.per_sequence is None:
            return torch.as_tensor(np.asarray(self.vectors, dtype=np.float32))
        v = self.per_sequence[np.asarray(pos)][:, :, :n]  # [B, L, n, H, d]
        return torch.as_tensor(np.ascontiguousarray(v.transpose(1, 0, 2, 3, 4)), dtype=torch.float32)


def replacement(means: np.ndarray, mode: str) -> Replacement:
    """Mean or zero replacement from the heads' mean vectors [L, H, d] (resample: ``resample_replacement``)."""
    if mode == "mean":
        return Replacement("mean", np.asarray(means, dtype=np.float32))
    if mode == "zero":
        return Replacement("zero", np.zeros_like(means, dtype=np.float32))
    raise ValueError(f"ablation mode must be one of {', '.join(MODES)}, not {mode!r}")


def donors(n: int, seed: int) -> np.ndarray:
    """A seeded derangement of 0..n-1 (n >= 2): every sequence gets another sequence's outputs."""
    if n < 2:
        raise ValueError("resample ablation needs at least 2 evaluation sequences")
    perm = np.random.default_rng([seed, 11]).permutation(n)
    return np.roll(perm, 1)[np.argsort(perm)]  # perm[i] -> perm[i-1]: one cycle, no fixed point


def resample_replacement(z: np.ndarray, lengths: np.ndarray, seed: int) -> Replacement:
    """``z`` [S, L, n, H, d] the heads' outputs per sequence (padded), ``lengths`` [S] real tokens."""
    S, _, n = z.shape[:3]
    donor = donors(S, seed)
    real = np.arange(n)[None, :] < np.asarray(lengths)[:, None]  # [S, n]
    w = real[:, None, :, None, None]
    mean = (z * w).sum(2, keepdims=True) / np.maximum(real.sum(1), 1)[:, None, None, None, None]
    filled = np.where(w, z, mean).astype(np.float32)
    return Replacement("resample", per_sequence=filled[donor], donor=donor)


def layer_modules(model, n_layers: int) -> list | None:
    """Per layer, the transformer block that holds its attention output projection (the module
    named by the projection's path up to the layer index), or None where that is not found."""
    pattern = head_output_pattern(model.config.model_type, "")
    found = {}
    for name, _ in model.named_modules():
        m = pattern.search(name)
        if m:
            found[int(m.group(1))] = name[: m.end(1)]
    if not found or sorted(found) != list(range(len(found))) or n_layers % len(found):
        return None
    modules = dict(model.named_modules())
    return [modules[found[i * len(found) // n_layers]] for i in range(n_layers)]


def _tile(t, blocks: int, rows: int):
    """A batch-shaped tensor (ndim >= 2, ``rows`` rows) repeated ``blocks`` times along the batch."""
    import torch

    if torch.is_tensor(t) and t.ndim >= 2 and t.shape[0] == rows and rows > 1 and blocks > 1:
        return t.repeat(blocks, *[1] * (t.ndim - 1))
    if isinstance(t, tuple):
        return tuple(_tile(x, blocks, rows) for x in t)
    return t


class HeadPatch:
    """Pre-hooks on the per-layer output projections ``modules`` (one per layer, in order) and,
    for expanded batches, on the per-layer blocks ``layers``."""

    def __init__(self, modules: list, n_heads: int, layers: list | None = None):
        self.modules = list(modules)
        self.layers = layers
        self.n_layers = len(self.modules)
        self.n_heads = n_heads
        self.mask = None  # [L, H] bool tensor: heads replaced in every row
        self.values = None  # [L, H, d] or [L, B, n, H, d] tensor: their replacement
        self.alpha = None  # layer paths: a block's own layer moved this share towards its replacement
        self.leaves: list = []  # layer paths, per block in order: (leaf at alpha, intact vector, replacement)
        self.blocks = None  # batched: per block of ``rows`` rows the flat head ablated (-1: intact)
        self.rows = 0
        self.plan: dict[int, list[int]] = {}  # expanded: layer -> heads whose blocks start there
        self.last = -1  # expanded: the last layer that starts blocks (the intact rows end there)
        self.captured: list = []
        self.capture = False
        self._calls = 0
        self._layer_calls = 0
        self._handles = []

    def __enter__(self) -> "HeadPatch":
        self._handles = [m.register_forward_pre_hook(self._hook) for m in dict.fromkeys(self.modules)]
        if self.layers is not None:
            self._handles += [
                m.register_forward_pre_hook(self._layer_hook, with_kwargs=True) for m in dict.fromkeys(self.layers)
            ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self) -> None:
        """Call before every forward pass."""
        self._calls = 0
        self._layer_calls = 0
        self.captured = []
        self.leaves = []
        if self.plan:
            self.blocks = [-1]

    def patched_values(self, layer: int, x):
        """The values a patched head of ``layer`` takes, for the layer's input ``x`` (a subclass may override)."""
        v = self.values[layer].to(device=x.device, dtype=x.dtype)
        if v.ndim == 4 and v.shape[0] != x.shape[0]:  # per row: one copy per block
            v = v.repeat(x.shape[0] // v.shape[0], 1, 1, 1)
        return v if v.ndim == 4 else v[None, None]  # [B', n, H, d] or [1, 1, H, d]

    def _hook(self, module, args):
        layer = self._calls % self.n_layers
        self._calls += 1
        x = args[0]
        heads = x.reshape(*x.shape[:-1], self.n_heads, -1)
        out = None
        if self.blocks is not None:
            hit = [(b, f % self.n_heads) for b, f in enumerate(self.blocks) if f >= 0 and f // self.n_heads == layer]
            if hit and self.alpha is not None:
                out = self._path(heads, self.patched_values(layer, x), [b for b, _ in hit])
            elif hit:
                import torch

                m = torch.zeros(len(self.blocks), self.n_heads, dtype=torch.bool)
                for b, h in hit:
                    m[b, h] = True
                m = m.repeat_interleave(self.rows, 0).to(x.device)[:, None, :, None]  # [B', 1, H, 1]
                out = heads.where(~m, self.patched_values(layer, x))
        elif self.mask is not None and bool(self.mask[layer].any()):
            m = self.mask[layer].to(x.device)[:, None]
            out = heads.where(~m, self.patched_values(layer, x))
        if out is not None:
            out = out.reshape(x.shape)
        if self.capture:
            self.captured.append(x if out is None else out)
        return None if out is None else (out,) + tuple(args[1:])

    def _path(self, heads, values, hit: list[int]):
        """Blocks ``hit`` (their own layer): z0 + alpha (v - z0) for all heads, each block's as a leaf."""
        import torch

        pieces = list(heads.split(self.rows))
        target = values.expand_as(heads).split(self.rows)
        for b in hit:
            z0, v = pieces[b].detach(), target[b].detach()
            pieces[b] = (z0 + self.alpha * (v - z0)).requires_grad_(True)
            self.leaves.append((pieces[b], z0, v))
        return torch.cat(pieces)

    def _layer_hook(self, module, args, kwargs):
        layer = self._layer_calls % self.n_layers
        self._layer_calls += 1
        if not self.plan or self.blocks is None:
            return None
        new = self.plan.get(layer, [])
        if not new and len(self.blocks) == 1:
            return None
        import torch

        positional = bool(args)
        hidden = args[0] if positional else kwargs["hidden_states"]
        if new:
            intact = hidden[: self.rows]
            hidden = torch.cat([hidden] + [intact] * len(new))
            self.blocks = self.blocks + list(new)
            if layer == self.last:  # no later head needs the intact rows
                hidden, self.blocks = hidden[self.rows :], self.blocks[1:]
        nb = len(self.blocks)
        rest = tuple(_tile(a, nb, self.rows) for a in args[1:])
        kw = {k: _tile(v, nb, self.rows) for k, v in kwargs.items() if k != "hidden_states"}
        if positional:
            return (hidden,) + rest, kw
        return rest, dict(kw, hidden_states=hidden)

    @contextmanager
    def ablated(self, mask: np.ndarray, values):
        """Replace heads ``mask`` [L, H] by ``values`` (tensor [L, H, d] or [L, B, n, H, d]) in the block."""
        import torch

        self.mask = torch.as_tensor(np.asarray(mask, dtype=bool))
        self.values = torch.as_tensor(values)
        try:
            yield self
        finally:
            self.mask = self.values = None

    @contextmanager
    def batched(self, heads: list[int], values, rows: int, expand: bool):
        """One block of ``rows`` rows per flat head (layer * H + head), in the order given, heads
        sorted by layer when ``expand`` (the blocks are then built inside the model; the caller
        feeds the intact rows once). Without ``expand`` the caller feeds ``len(heads)`` copies."""
        import torch

        heads = [int(h) for h in heads]
        self.values, self.rows = torch.as_tensor(values), rows
        if expand:
            if self.layers is None:
                raise ValueError("expanded batches need the model's layer modules")
            if heads != sorted(heads):
                raise ValueError("expanded batches take heads in layer order")
            self.plan = {}
            for f in heads:
                self.plan.setdefault(f // self.n_heads, []).append(f)
            self.last = max(self.plan)
            self.blocks = [-1]
        else:
            self.blocks = heads
        try:
            yield self
        finally:
            self.values, self.blocks, self.plan, self.last = None, None, {}, -1

    @contextmanager
    def layer_paths(self, layers: list[int], alpha: float, values, rows: int, expand: bool):
        """One block of ``rows`` rows per layer of ``layers`` (sorted), in which every head of that
        layer is moved the share ``alpha`` from its intact vector z0 to its replacement v: the
        layers before it run intact, the later ones are recomputed. After a forward pass ``leaves``
        holds per block (z0 + alpha (v - z0) as a leaf tensor, z0, v) [rows, n, H, d]."""
        self.alpha = float(alpha)
        try:
            with self.batched([int(lay) * self.n_heads for lay in layers], values, rows, expand):
                yield self
        finally:
            self.alpha, self.leaves = None, []


def random_heads(n_layers: int, n_heads: int, k: int, rng: np.random.Generator, exclude=()) -> list[tuple[int, int]]:
    """``k`` distinct (layer, head) drawn uniformly outside ``exclude``."""
    flat = np.setdiff1d(np.arange(n_layers * n_heads), [l * n_heads + h for l, h in exclude])
    pick = rng.choice(flat, size=min(k, len(flat)), replace=False)
    return [(int(i // n_heads), int(i % n_heads)) for i in np.sort(pick)]


def layer_samples(n_layers: int, n_heads: int, k: int, seed: int) -> list[list[int]]:
    """Per layer ``k`` distinct heads (all where the layer has no more), seeded: the layer check."""
    rng = np.random.default_rng([seed, 13])
    return [sorted(int(h) for h in rng.choice(n_heads, size=min(k, n_heads), replace=False)) for _ in range(n_layers)]
