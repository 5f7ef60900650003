"""The two measurements ablations change, and the passes that measure them.

- ``lm``: next-token loss (mean cross-entropy over a sequence's targets) of a model with a
  causal-LM head from its checkpoint, on the first segments of a corpus, tokenised as
  extraction does (BOS convention, truncated to ``max_tokens``);
- ``classification``: a fine-tuned classifier (``finetuned`` source, its classification head
  saved by rule finetune_model) on the first examples of its task's dev file: per example the
  cross-entropy of the gold label and whether the prediction is right.

A model that cannot be measured gets a reason instead (no LM head, an encoder, not a
fine-tuned classifier); the rules write it to the log and the tables.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

from .patch import HeadPatch

log = logging.getLogger("headatlas.ablation.tasks")

TASKS = ("lm", "classification")


@dataclass
class Evaluation:
    """A model, its evaluation batches and a patch on its head outputs.

    ``batches``: (model inputs, targets, sequence positions) with targets [B, n] token ids
    (-100: no loss) for ``lm`` and [B] label ids for ``classification``."""

    task: str
    model: object
    batches: list
    n_sequences: int
    n_layers: int
    n_heads: int
    patch: HeadPatch = field(init=False)

    def __post_init__(self):
        from ..core.extract import head_output_modules

        self.patch = HeadPatch(head_output_modules(self.model, self.n_layers), self.n_heads)

    def _metrics(self, out, targets):
        import torch.nn.functional as F

        logits = out.logits.float()
        if self.task == "lm":
            logits, target = logits[:, :-1], targets[:, 1:]
            tok = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
            loss = tok.sum(1) / (target != -100).sum(1).clamp(min=1)
            return loss, None
        loss = F.cross_entropy(logits, targets, reduction="none")
        return loss, (logits.argmax(-1) == targets).float()

    def run(self, mask: np.ndarray | None = None, values: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per-sequence ``loss`` (and ``correct`` for classification) with heads ``mask`` [L, H]
        replaced by ``values`` [L, H, d] (none: the intact model)."""
        import torch

        loss = np.zeros(self.n_sequences)
        correct = np.zeros(self.n_sequences)
        with self.patch, torch.inference_mode():
            with self.patch.ablated(mask, values) if mask is not None else nullcontext():
                for inputs, targets, pos in self.batches:
                    self.patch.reset()
                    lo, co = self._metrics(self.model(**inputs), targets)
                    loss[pos] = lo.cpu().numpy()
                    if co is not None:
                        correct[pos] = co.cpu().numpy()
        out = {"loss": loss}
        if self.task == "classification":
            out["correct"] = correct
        return out

    def mean_vectors(self) -> np.ndarray:
        """The heads' mean vectors over every real token of the evaluation set [L, H, d]."""
        import torch

        sums, count = 0.0, 0
        with self.patch, torch.inference_mode():
            self.patch.capture = True
            try:
                for inputs, _, _ in self.batches:
                    self.patch.reset()
                    self.model(**inputs)
                    real = inputs["attention_mask"].bool()
                    z = torch.stack([t.reshape(*real.shape, self.n_heads, -1) for t in self.patch.captured], 1)
                    sums = sums + (z.float() * real[:, None, :, None, None]).sum((0, 2)).double().cpu().numpy()
                    count += int(real.sum())
            finally:
                self.patch.capture = False
                self.patch.reset()
        return sums / max(count, 1)

    def gradient_pass(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """One forward and one backward pass over every batch: the intact per-sequence metrics,
        the heads' mean vectors over real tokens [L, H, d], and per sequence the loss gradients
        summed over positions [S, L, H, d] and sum_i z_i . g_i [S, L, H] (attribution patching)."""
        import torch

        S, L, H = self.n_sequences, self.n_layers, self.n_heads
        loss = np.zeros(S)
        correct = np.zeros(S)
        sums = counts = grad_sums = zg = None
        with self.patch, torch.enable_grad():
            self.patch.capture = True
            try:
                for inputs, targets, pos in self.batches:
                    self.patch.reset()
                    lo, co = self._metrics(self.model(**inputs), targets)
                    zs = self.patch.captured
                    grads = torch.autograd.grad(lo.sum(), zs)
                    real = inputs["attention_mask"].bool()
                    B, n = real.shape
                    z = torch.stack([t.detach().reshape(B, n, H, -1) for t in zs], 1).float()  # [B, L, n, H, d]
                    g = torch.stack([t.reshape(B, n, H, -1) for t in grads], 1).float()
                    w = real[:, None, :, None, None]
                    if sums is None:
                        d = z.shape[-1]
                        sums, counts = np.zeros((L, H, d)), 0
                        grad_sums, zg = np.zeros((S, L, H, d), np.float32), np.zeros((S, L, H))
                    sums += (z * w).sum((0, 2)).double().cpu().numpy()
                    counts += int(real.sum())
                    grad_sums[pos] = (g * w).sum(2).cpu().numpy()
                    zg[pos] = ((z * g) * w).sum((2, 4)).double().cpu().numpy()
                    loss[pos] = lo.detach().cpu().numpy()
                    if co is not None:
                        correct[pos] = co.cpu().numpy()
            finally:
                self.patch.capture = False
                self.patch.reset()
        metrics = {"loss": loss}
        if self.task == "classification":
            metrics["correct"] = correct
        return metrics, sums / max(counts, 1), grad_sums, zg


def _bucketed(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    from ..core.extract import length_batches

    return length_batches(lengths, batch_size)


def lm_evaluation(
    spec, loc: str, kwargs: dict, records, n_sequences: int, max_tokens: int, batch_size: int, device: str = "cpu"
):
    """(Evaluation, None) for a decoder with a causal-LM head, else (None, reason)."""
    from transformers import AutoConfig, AutoTokenizer

    from ..core.extract import model_inputs, tokenize_records
    from ..core.models import decoder_bos, lm_head_model, model_kind

    config = AutoConfig.from_pretrained(loc, **kwargs)
    kind = model_kind(config, spec)
    model, reason = lm_head_model(loc, kind, kwargs)
    if model is None:
        return None, reason
    if kind != "decoder":
        return None, "an encoder: the loss ablation measures next-token loss, which needs a causal LM"
    model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, _ = tokenize_records(
        records[:n_sequences], tokenizer, kind, min(max_tokens, spec.max_length), "truncate", bos
    )
    tokenized = [t for t in tokenized if len(t) >= 2]
    if not tokenized:
        raise ValueError(f"model {spec.name!r}: no record of the corpus gives a sequence of 2 tokens or more")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    use_types = getattr(model.config, "type_vocab_size", 0) > 1
    device = next(model.parameters()).device
    batches = []
    for pos in _bucketed([len(t) for t in tokenized], batch_size):
        batch = [tokenized[p] for p in pos]
        inputs = model_inputs(batch, use_types, pad, device)
        targets = inputs["input_ids"].clone()
        targets[inputs["attention_mask"] == 0] = -100
        batches.append((inputs, targets, np.asarray(pos)))
    L, H = int(config.num_hidden_layers), int(config.num_attention_heads)
    return Evaluation("lm", model, batches, len(tokenized), L, H), None


def classification_evaluation(
    loc: str, kwargs: dict, task: dict | None, n_examples: int, batch_size: int, device: str = "cpu"
):
    """(Evaluation, None) for a fine-tuned classifier whose head is in the checkpoint, else (None, reason)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..core.corpora import tsv_records
    from ..core.finetune import _encode

    if task is None:
        return None, "not a fine-tuned classifier (no finetuned source in the config)"
    model, info = AutoModelForSequenceClassification.from_pretrained(
        loc, attn_implementation="eager", dtype=torch.float32, output_loading_info=True, **kwargs
    )
    missing = [k for k in info.get("missing_keys", ()) if "classifier" in k or "score" in k]
    if missing:
        return None, f"the checkpoint has no classification head (missing weights: {', '.join(missing[:4])})"
    model.eval()
    model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.bos_token
    dev = tsv_records(task["dev"], task["text_columns"], task["label_column"])[:n_examples]
    to_id = {str(k): int(v) for k, v in model.config.label2id.items()}
    unknown = sorted({r.label for r in dev} - set(to_id))
    if unknown:
        raise ValueError(f"{task['dev']}: labels {unknown[:5]} are not among the model's labels {sorted(to_id)}")
    y = np.array([to_id[r.label] for r in dev])
    max_length = int(task.get("max_length", 64))
    lengths = [len(tokenizer(" ".join(r.words), truncation=True, max_length=max_length)["input_ids"]) for r in dev]
    batches = []
    for pos in _bucketed(lengths, batch_size):
        enc = {k: v.to(device) for k, v in _encode(tokenizer, [dev[p] for p in pos], max_length).items()}
        batches.append((enc, torch.as_tensor(y[pos], device=device), pos))
    L, H = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    return Evaluation("classification", model, batches, len(dev), L, H), None


def evaluations(
    spec, cache_dir, records, task: dict | None, settings, device: str | None = None
) -> tuple[dict[str, tuple], tuple[int, int]]:
    """task -> (Evaluation, None) or (None, reason why the model is skipped), for both tasks, on ``device``
    (default: the job's, :func:`headatlas.core.device.job_device`); and the model's (layers, heads)."""
    from transformers import AutoConfig

    from ..core.device import job_device
    from ..core.models import resolve

    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    shape = (int(config.num_hidden_layers), int(config.num_attention_heads))
    device = device or job_device(spec.device)
    s = settings
    out = {
        "lm": lm_evaluation(spec, loc, kwargs, records, s.lm_sequences, s.lm_max_tokens, s.batch_size, device),
        "classification": classification_evaluation(loc, kwargs, task, s.classification_examples, s.batch_size, device),
    }
    for name, (ev, reason) in out.items():
        if ev is None:
            log.warning("model %s: %s ablation skipped: %s", spec.name, name, reason)
        else:
            log.info("model %s: %s ablation on %d sequences", spec.name, name, ev.n_sequences)
    return out, shape
