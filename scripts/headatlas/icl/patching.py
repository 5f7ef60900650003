"""Patching heads at the last position of ICL prompts (Todd et al. 2024's indirect effect).

The exact ablation's machinery does the work (``headatlas.ablation``): its head patch on the output
projections, its batched single-head passes (one block of batch rows per head, built inside the model)
and its layer check. What differs here is confined to two places:

- :class:`LastPositionPatch` replaces a head's output (the input of the output projection, its slice of
  the head-major concat) at the last position of every row only, by the mean of its task (Todd et al.'s
  ``replace_activation_w_avg`` with ``last_token_only``); every other position keeps its own value;
- :class:`FVEvaluation`'s measurement is p(target) at the last position (softmax of the last logits), in
  the slot the ablation calls ``loss``: ``exact`` gives p(target | patched), ``run`` p(target | corrupted),
  so the ablation's effect ``ablated - intact`` is the indirect effect; ``estimate`` is attribution
  patching of that difference.

Prompts of one batch have one length (no padding), so the last position is the last column.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..ablation.patch import HeadPatch
from ..ablation.tasks import Evaluation, stack_layers
from ..core.device import input_device


@dataclass
class TaskMeans:
    """Per task the heads' mean outputs at the last position ``vectors`` [T, L, H, d], and each prompt's
    task ``task_of`` [S]: every prompt gets its own task's means (a :class:`Replacement` for the patch)."""

    vectors: np.ndarray
    task_of: np.ndarray
    mode: str = "mean"

    def for_batch(self, pos: np.ndarray, n: int):
        """[L, B, H, d] for the prompts ``pos``."""
        import torch

        v = self.vectors[self.task_of[np.asarray(pos)]]  # [B, L, H, d]
        return torch.as_tensor(np.ascontiguousarray(v.transpose(1, 0, 2, 3)), dtype=torch.float32)

    def permuted(self, flat: np.ndarray) -> "TaskMeans":
        """Head i of the grid takes head ``flat[i]``'s means (flat = layer * H + head): the null."""
        T, L, H, d = self.vectors.shape
        v = self.vectors.reshape(T, L * H, d)[:, np.asarray(flat)].reshape(T, L, H, d)
        return TaskMeans(v, self.task_of, "null")


class LastPositionPatch(HeadPatch):
    """The ablation's head patch, replacing only the last position: per row the patched values [B, H, d]
    (or one [H, d] for all rows) at position -1, the head's own output elsewhere."""

    def patched_values(self, layer: int, x):
        v = self.values[layer].to(device=x.device, dtype=x.dtype)
        heads = x.reshape(*x.shape[:-1], self.n_heads, -1)  # [B', n, H, d]
        if v.ndim == 3 and v.shape[0] != heads.shape[0]:  # per row: one copy per block
            v = v.repeat(heads.shape[0] // v.shape[0], 1, 1)
        out = heads.clone()
        out[:, -1] = v
        return out


class FVEvaluation(Evaluation):
    """Corrupted (or clean) prompts of equal length per batch; ``batches`` as the ablation's, with
    targets [B] the target token ids."""

    def __post_init__(self):
        import inspect

        super().__post_init__()
        self.patch = LastPositionPatch(self.patch.modules, self.n_heads, self.patch.layers)
        self.values = None  # the TaskMeans that ``replacement`` hands to the ablation's tables
        if "logits_to_keep" in inspect.signature(self.model.forward).parameters:  # only the last logits are read
            self.batches = [(dict(inputs, logits_to_keep=1), t, pos) for inputs, t, pos in self.batches]

    def _metrics(self, out, targets):
        logits = out.logits[:, -1].float()
        p = logits.softmax(-1).gather(1, targets[:, None])[:, 0]
        return p, (logits.argmax(-1) == targets).float()

    def _out(self, loss, correct) -> dict[str, np.ndarray]:
        return {"loss": loss, "correct": correct}

    def replacement(self, mode: str, seed: int) -> TaskMeans:
        if mode != "mean" or self.values is None:
            raise ValueError("ICL patching replaces a head by its task's mean output (mode mean), set in .values")
        return self.values

    def last_outputs(self) -> np.ndarray:
        """Every head's output at the last position of every prompt [S, L, H, d] (unpatched)."""
        import torch

        z = None
        with self.patch, torch.inference_mode():
            self.patch.capture = True
            try:
                for inputs, _, pos in self.batches:
                    self.patch.reset()
                    self.model(**inputs)
                    B, n = inputs["input_ids"].shape
                    zb = stack_layers(self.patch.captured, B, n, self.n_heads)[:, :, -1]  # [B, L, H, d]
                    if z is None:
                        z = np.zeros((self.n_sequences, *zb.shape[1:]), np.float32)
                    z[pos] = zb.cpu().numpy()
            finally:
                self.patch.capture = False
                self.patch.reset()
        return z

    def estimate(self, values: TaskMeans, method: str = "atp", steps: int = 1, max_rows: int = 4096) -> np.ndarray:
        """Attribution patching [S, L * H]: (v - z) . dp(target)/dz at the last position, z the corrupted
        prompt's head output and v its replacement; one forward and one backward pass per batch."""
        import torch

        if method != "atp":
            raise ValueError(f"ICL patching has one estimator, atp, not {method!r}")
        S, L, H = self.n_sequences, self.n_layers, self.n_heads
        est = np.zeros((S, L * H))
        with self.patch, torch.enable_grad():
            self.patch.capture = True
            try:
                for inputs, targets, pos in self.batches:
                    B, n = inputs["input_ids"].shape
                    self.patch.reset()
                    p, _ = self._metrics(self.model(**inputs), targets)
                    grads = torch.autograd.grad(p.sum(), self.patch.captured)
                    g = stack_layers(grads, B, n, H)[:, :, -1]  # [B, L, H, d]
                    z0 = stack_layers([t.detach() for t in self.patch.captured], B, n, H)[:, :, -1]
                    v = values.for_batch(pos, n).permute(1, 0, 2, 3)
                    est[pos] = ((v - z0) * g).sum(-1).reshape(B, L * H).double().cpu().numpy()
            finally:
                self.patch.capture = False
                self.patch.reset()
        return est


def equal_length_batches(ids: list[list[int]], batch_size: int) -> list[np.ndarray]:
    """Prompt positions grouped by token count, in batches of at most ``batch_size``."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(ids):
        by_len[len(t)].append(i)
    return [np.asarray(g[i : i + batch_size]) for _, g in sorted(by_len.items()) for i in range(0, len(g), batch_size)]


def fv_evaluation(model, ids: list[list[int]], targets: np.ndarray, batch_size: int, n_layers: int, n_heads: int):
    """An :class:`FVEvaluation` of prompts ``ids`` (token id lists) with targets [S] on the model's device."""
    import torch

    device = input_device(model)
    batches = []
    for pos in equal_length_batches(ids, batch_size):
        x = torch.as_tensor([ids[i] for i in pos], dtype=torch.long, device=device)
        inputs = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        batches.append((inputs, torch.as_tensor(targets[pos], device=device), pos))
    return FVEvaluation("lm", model, batches, len(ids), n_layers, n_heads)
