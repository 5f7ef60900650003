"""Head patching at the per-head output projection (the place extraction reads the per-head vectors).

The input of a layer's attention output projection (its row ``head_output`` in
``core.models.ARCHITECTURES``) is the head-major concatenation of the heads' context vectors
sum_j A_ij v_j. A forward pre-hook on that module sees it as ``[batch, n, H * d]``; head h is
the slice ``[h * d, (h + 1) * d)``. :class:`HeadPatch` hooks every layer's projection and either

- replaces the slices of chosen heads (``ablate``: mean or zero ablation; every position), or
- captures the vectors with their autograd graph (``capture``: attribution patching).

The hook counts its calls to know the layer (layers run in order; ALBERT's shared projection
is one module called once per layer), so one hook per distinct module serves every layer.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np


class HeadPatch:
    """Pre-hooks on the per-layer output projections ``modules`` (one per layer, in order)."""

    def __init__(self, modules: list, n_heads: int):
        self.modules = list(modules)
        self.n_layers = len(self.modules)
        self.n_heads = n_heads
        self.mask = None  # [L, H] bool tensor: heads replaced
        self.values = None  # [L, H, d] tensor: their replacement
        self.captured: list = []
        self.capture = False
        self._calls = 0
        self._handles = []

    def __enter__(self) -> "HeadPatch":
        self._handles = [m.register_forward_pre_hook(self._hook) for m in dict.fromkeys(self.modules)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self) -> None:
        """Call before every forward pass."""
        self._calls = 0
        self.captured = []

    def _hook(self, module, args):
        layer = self._calls % self.n_layers
        self._calls += 1
        x = args[0]
        if self.capture:
            self.captured.append(x)
        if self.mask is None or not bool(self.mask[layer].any()):
            return None
        shape = x.shape
        heads = x.reshape(*shape[:-1], self.n_heads, -1)
        m = self.mask[layer].to(x.device)[:, None]
        v = self.values[layer].to(device=x.device, dtype=x.dtype)
        return (heads.where(~m, v).reshape(shape),) + tuple(args[1:])

    @contextmanager
    def ablated(self, mask: np.ndarray, values: np.ndarray):
        """Replace heads ``mask`` [L, H] by ``values`` [L, H, d] inside the block."""
        import torch

        self.mask = torch.as_tensor(np.asarray(mask, dtype=bool))
        self.values = torch.as_tensor(np.asarray(values, dtype=np.float32))
        try:
            yield self
        finally:
            self.mask = self.values = None


def replacement(means: np.ndarray, mode: str) -> np.ndarray:
    """The vectors ablated heads get: their mean over the evaluation set, or zero."""
    if mode == "mean":
        return np.asarray(means, dtype=np.float32)
    if mode == "zero":
        return np.zeros_like(means, dtype=np.float32)
    raise ValueError(f"ablation mode must be 'mean' or 'zero', not {mode!r}")


def attribution_estimates(grad_sums: np.ndarray, zg: np.ndarray, values: np.ndarray) -> np.ndarray:
    """First-order effect of replacing every head's vector z by ``values`` at every position.

    Per sequence s: sum_i (v - z_i) . dM/dz_i = v . G_s - sum_i z_i . g_i, with ``grad_sums``
    G [S, L, H, d] (gradients summed over positions) and ``zg`` [S, L, H] (sum of z . g).
    Returns [S, L, H]."""
    return np.einsum("slhd,lhd->slh", grad_sums, values) - zg


def random_heads(n_layers: int, n_heads: int, k: int, rng: np.random.Generator, exclude=()) -> list[tuple[int, int]]:
    """``k`` distinct (layer, head) drawn uniformly outside ``exclude``."""
    flat = np.setdiff1d(np.arange(n_layers * n_heads), [l * n_heads + h for l, h in exclude])
    pick = rng.choice(flat, size=min(k, len(flat)), replace=False)
    return [(int(i // n_heads), int(i % n_heads)) for i in np.sort(pick)]
