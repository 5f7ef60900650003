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

from ..core.batching import length_batches, model_inputs, pad_token
from ..core.corpora import tsv_records
from ..core.device import input_device, job_device
from ..core.extract import head_output_modules, tokenize_records
from ..core.finetune import FinetuneSettings, encode_records
from ..core.models import decoder_bos, from_pretrained, lm_head_model, model_kind, resolve
from .patch import MODES, HeadPatch, Replacement, layer_modules, replacement, resample_replacement

log = logging.getLogger("headatlas.ablation.tasks")

TASKS = ("lm", "classification")
ESTIMATORS = ("atp", "ig", "atpstar")


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
        layers = layer_modules(self.model, self.n_layers)
        self.patch = HeadPatch(head_output_modules(self.model, self.n_layers), self.n_heads, layers)
        self.expand = layers is not None  # batched exact ablation expands inside the model where it can
        self._verified = False  # the first expanded pass is checked against replicated inputs

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

    def _out(self, loss, correct) -> dict[str, np.ndarray]:
        out = {"loss": loss}
        if self.task == "classification":
            out["correct"] = correct
        return out

    def run(self, mask: np.ndarray | None = None, values: Replacement | None = None) -> dict[str, np.ndarray]:
        """Per-sequence ``loss`` (and ``correct`` for classification) with heads ``mask`` [L, H]
        replaced by ``values`` (none: the intact model)."""
        import torch

        loss = np.zeros(self.n_sequences)
        correct = np.zeros(self.n_sequences)
        with self.patch, torch.inference_mode():
            for inputs, targets, pos in self.batches:
                n = inputs["input_ids"].shape[1]
                with self.patch.ablated(mask, values.for_batch(pos, n)) if mask is not None else nullcontext():
                    self.patch.reset()
                    lo, co = self._metrics(self.model(**inputs), targets)
                loss[pos] = lo.cpu().numpy()
                if co is not None:
                    correct[pos] = co.cpu().numpy()
        return self._out(loss, correct)

    def exact(self, heads, values: Replacement, max_rows: int = 4096) -> dict[str, np.ndarray]:
        """Exact single-head ablation of every flat head of ``heads`` (layer * H + head), batched:
        one block of batch rows per head, as many heads per forward pass as keep the batch within
        ``max_rows`` token rows. Returns per metric the per-sequence values [S, len(heads)]."""
        import torch

        heads = np.asarray(heads, dtype=np.int64)
        order = np.argsort(heads, kind="stable")
        out = {m: np.zeros((self.n_sequences, len(heads))) for m in ("loss", "correct")}
        with self.patch, torch.inference_mode():
            for inputs, targets, pos in self.batches:
                B, n = inputs["input_ids"].shape
                per = max(1, max_rows // (B * n))
                v = values.for_batch(pos, n)
                for c in range(0, len(order), per):
                    chunk = order[c : c + per]
                    lo, co = self._exact_chunk(inputs, targets, heads[chunk], v)
                    out["loss"][np.ix_(pos, chunk)] = lo.reshape(len(chunk), B).T.cpu().numpy()
                    if co is not None:
                        out["correct"][np.ix_(pos, chunk)] = co.reshape(len(chunk), B).T.cpu().numpy()
        return {m: out[m] for m in self._out(None, None)}

    def _exact_chunk(self, inputs, targets, chunk, v):
        """Metrics [len(chunk) * B] of one forward pass ablating one head per block. The first
        expanded pass is checked against replicated inputs on its last head."""
        import torch

        B = inputs["input_ids"].shape[0]
        k = len(chunk)
        if self.expand:
            try:
                with self.patch.batched(chunk, v, B, expand=True):
                    self.patch.reset()
                    out = self.model(**inputs)
                if out.logits.shape[0] == k * B:
                    got = self._metrics(out, _tile_batch(targets, k))
                    if self._verified:
                        return got
                    ref = self._exact_chunk_replicated(inputs, targets, chunk[-1:], v)[0]
                    if torch.allclose(got[0][-B:], ref, rtol=1e-5, atol=1e-5):
                        self._verified = True
                        return got
                    reason = "its losses differ from replicated inputs"
                else:
                    reason = f"the output has {out.logits.shape[0]} rows, not {k * B}"
            except (RuntimeError, ValueError, IndexError) as e:
                reason = str(e).splitlines()[0][:200]
            log.warning("%s: batch expansion inside the model failed (%s); replicating the inputs", self.task, reason)
            self.expand = False
        return self._exact_chunk_replicated(inputs, targets, chunk, v)

    def _exact_chunk_replicated(self, inputs, targets, chunk, v):
        B, k = inputs["input_ids"].shape[0], len(chunk)
        with self.patch.batched(chunk, v, B, expand=False):
            self.patch.reset()
            out = self.model(**_tile_inputs(inputs, k))
        return self._metrics(out, _tile_batch(targets, k))

    def head_outputs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every head's output per sequence and position, z [S, L, n, H, d] (zero-padded to the
        longest sequence), and the sequences' real token counts [S]."""
        import torch

        n_max = max(int(inputs["input_ids"].shape[1]) for inputs, _, _ in self.batches)
        z = lengths = None
        with self.patch, torch.inference_mode():
            self.patch.capture = True
            try:
                for inputs, _, pos in self.batches:
                    self.patch.reset()
                    self.model(**inputs)
                    real = inputs["attention_mask"].bool()
                    B, n = real.shape
                    zb = torch.stack([t.reshape(B, n, self.n_heads, -1) for t in self.patch.captured], 1).float()
                    if z is None:
                        z = np.zeros((self.n_sequences, self.n_layers, n_max, self.n_heads, zb.shape[-1]), np.float32)
                        lengths = np.zeros(self.n_sequences, np.int64)
                    z[pos, :, :n] = (zb * real[:, None, :, None, None]).cpu().numpy()
                    lengths[pos] = real.sum(1).cpu().numpy()
            finally:
                self.patch.capture = False
                self.patch.reset()
        return z, lengths

    def mean_vectors(self) -> np.ndarray:
        """The heads' mean vectors over every real token of the evaluation set [L, H, d]."""
        z, lengths = self.head_outputs()
        return z.sum((0, 2)).astype(np.float64) / max(int(lengths.sum()), 1)

    def replacement(self, mode: str, seed: int) -> Replacement:
        """The ablated heads' replacement for ``mode`` (mean, zero, resample: seeded donors)."""
        if mode not in MODES:
            raise ValueError(f"ablation mode must be one of {', '.join(MODES)}, not {mode!r}")
        z, lengths = self.head_outputs()
        if mode == "resample":
            return resample_replacement(z, lengths, seed)
        return replacement(z.sum((0, 2)).astype(np.float64) / max(int(lengths.sum()), 1), mode)

    def estimate(self, values: Replacement, method: str = "atp", steps: int = 1, max_rows: int = 4096) -> np.ndarray:
        """First-order estimates [S, L * H] of every head's loss effect.

        ``atp`` (attribution patching): sum over positions of (v - z) . dLoss/dz at the intact
        model, one forward and one backward pass. ``ig``: integrated gradients along each layer's
        own path, see :func:`_layer_path_estimate`. ``atpstar``: AtP* for head outputs (Kramar et
        al. 2024), see :func:`_graddrop_estimate`."""
        import torch

        if method not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, not {method!r}")
        if method == "atpstar":
            return _graddrop_estimate(self, values)
        if method == "ig":
            return _layer_path_estimate(self, values, steps, max_rows)
        S, L, H = self.n_sequences, self.n_layers, self.n_heads
        est = np.zeros((S, L * H))
        with self.patch, torch.enable_grad():
            self.patch.capture = True
            try:
                for inputs, targets, pos in self.batches:
                    B, n = inputs["input_ids"].shape
                    v = values.for_batch(pos, n)
                    self.patch.reset()
                    lo, _ = self._metrics(self.model(**inputs), targets)
                    grads = torch.autograd.grad(lo.sum(), self.patch.captured)
                    z0 = stack_layers([t.detach() for t in self.patch.captured], B, n, H)
                    vb = v[None, :, None] if v.ndim == 3 else v.permute(1, 0, 2, 3, 4)  # [1|B, L, 1|n, H, d]
                    w = inputs["attention_mask"].bool()[:, None, :, None, None]
                    d = ((vb.float() - z0) * stack_layers(grads, B, n, H)) * w
                    est[pos] = d.sum((2, 4)).reshape(B, L * H).double().cpu().numpy()
            finally:
                self.patch.capture = False
                self.patch.reset()
        return est


def _layer_path_estimate(
    ev: Evaluation, values: Replacement, steps: int, max_rows: int, only: list[int] | None = None
) -> np.ndarray:
    """Integrated gradients per layer. For every layer l a path on which only layer l's heads move
    from intact (alpha = 0) to their replacement (alpha = 1), the layers before it intact and the
    later ones recomputed; a head's estimate is (v - z0) . dLoss/dz averaged over ``steps`` midpoints
    alpha = (k + 1/2) / steps of its layer's path. A layer's estimates add up to the exact effect of
    ablating all its heads at once (up to the midpoint rule), and a head's estimate is its exact
    single-head effect wherever its layer's heads reach the metric through separate nonlinearities
    (or linearly); what it misses is the interaction of heads of one layer. (A path of its own for
    every head would cost more than its exact ablation.) One block of batch rows per layer, built
    inside the model as for exact ablation where it can: per step about (L + 1) / 2 forward passes
    and their backward passes, over blocks of at most ``max_rows`` / 4 token rows. ``only``: these
    layers' heads only (the others NaN), to share the work out."""
    import torch

    S, L, H = ev.n_sequences, ev.n_layers, ev.n_heads
    est = np.full((S, L * H), np.nan)
    todo = sorted(range(L) if only is None else only)
    alphas = [(k + 0.5) / steps for k in range(steps)]
    with ev.patch, torch.enable_grad():
        for inputs, targets, pos in ev.batches:
            B, n = inputs["input_ids"].shape
            v = values.for_batch(pos, n)
            w = inputs["attention_mask"].bool()[:, :, None, None]
            per = max(1, max_rows // (4 * B * n))  # with the backward graph: a quarter of exact's rows
            for c in range(0, len(todo), per):
                layers = todo[c : c + per]
                g = 0.0
                for a in alphas:
                    leaves, grads = _path_pass(ev, inputs, targets, layers, a, v)
                    g = g + torch.stack([t.reshape(B, n, H, -1) for t in grads]).float()
                dz = torch.stack([(x - z0).reshape(B, n, H, -1) for _, z0, x in leaves]).float()
                d = (dz * g / len(alphas) * w).sum((2, 4))  # [k, B, H]
                flat = [lay * H + h for lay in layers for h in range(H)]
                est[np.ix_(pos, flat)] = d.permute(1, 0, 2).reshape(B, -1).double().cpu().numpy()
    return est


def _path_pass(ev: Evaluation, inputs, targets, layers: list[int], alpha: float, v) -> list:
    """One forward and backward pass of :meth:`HeadPatch.layer_paths`: its leaves and the loss's
    gradients w.r.t. them. Expanded inside the model where it can (else, and from then on, replicated inputs)."""
    import torch

    B, k = inputs["input_ids"].shape[0], len(layers)

    def grads(out, leaves):
        loss = ev._metrics(out, _tile_batch(targets, k))[0].sum()
        return leaves, torch.autograd.grad(loss, [t for t, _, _ in leaves])

    if ev.expand:
        try:
            with ev.patch.layer_paths(layers, alpha, v, B, expand=True):
                ev.patch.reset()
                out = ev.model(**inputs)
                leaves = ev.patch.leaves
                if out.logits.shape[0] == k * B and len(leaves) == k:
                    return grads(out, leaves)
                reason = f"the output has {out.logits.shape[0]} rows, not {k * B}"
        except (RuntimeError, ValueError, IndexError) as e:
            reason = str(e).splitlines()[0][:200]
        log.warning("%s: batch expansion inside the model failed (%s); replicating the inputs", ev.task, reason)
        ev.expand = False
    with ev.patch.layer_paths(layers, alpha, v, B, expand=False):
        ev.patch.reset()
        out = ev.model(**_tile_inputs(inputs, k))
        return grads(out, ev.patch.leaves)


def _graddrop_estimate(ev: Evaluation, values: Replacement) -> np.ndarray:
    """AtP* for head-output nodes (Kramar et al. 2024, "AtP*: An efficient and scalable method for
    localizing LLM behaviour to components"): GradDrop. For every layer l one backward pass with the
    gradient through layer l's residual contribution dropped (its output becomes input + stopgrad
    (output - input): same values, the layer is the identity for the gradient), giving AtP_l; the
    paper's magnitude (1 / (L - 1)) sum_l |AtP_l| per sequence, signed here by plain AtP's sign
    (our effects are signed). The dropped own layer gives 0 (hence L - 1), earlier layers give
    plain AtP. The paper's other fix, recomputing the attention softmax when queries or keys are
    patched, does not apply: an output node sits after its softmax. 1 forward + L + 1 backward passes."""
    import torch

    S, L, H = ev.n_sequences, ev.n_layers, ev.n_heads
    layers = ev.patch.layers
    if layers is None:
        raise ValueError("estimator atpstar needs the model's layer modules (GradDrop drops one layer's gradient)")
    drop = [-1]
    calls = [0]

    def hook(module, args, kwargs, output):
        layer = calls[0] % L
        calls[0] += 1
        inp = args[0] if args else kwargs["hidden_states"]
        out = output[0] if isinstance(output, tuple) else output
        if not out.requires_grad:
            return None
        delta = out - inp
        delta.register_hook(lambda g, layer=layer: torch.zeros_like(g) if drop[0] == layer else g)
        new = inp + delta
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    est = np.zeros((S, L * H))
    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in dict.fromkeys(layers)]
    try:
        with ev.patch, torch.enable_grad():
            ev.patch.capture = True
            for inputs, targets, pos in ev.batches:
                B, n = inputs["input_ids"].shape
                v = values.for_batch(pos, n)
                ev.patch.reset()
                calls[0] = 0
                lo, _ = ev._metrics(ev.model(**inputs), targets)
                z0 = stack_layers([t.detach() for t in ev.patch.captured], B, n, H)
                vb = v[None, :, None] if v.ndim == 3 else v.permute(1, 0, 2, 3, 4)
                dz = (vb.float() - z0) * inputs["attention_mask"].bool()[:, None, :, None, None]
                atp = magnitude = None
                for d in range(-1, L):  # -1: plain attribution patching (the sign)
                    drop[0] = d
                    grads = torch.autograd.grad(lo.sum(), ev.patch.captured, retain_graph=d < L - 1)
                    e = (dz * stack_layers(grads, B, n, H)).sum((2, 4)).reshape(B, L * H).double()
                    if d < 0:
                        atp = e
                    else:
                        magnitude = e.abs() if magnitude is None else magnitude + e.abs()
                est[pos] = (torch.sign(atp) * magnitude / max(L - 1, 1)).cpu().numpy()
    finally:
        for h in handles:
            h.remove()
        ev.patch.capture = False
        ev.patch.reset()
        drop[0] = -1
    return est


def stack_layers(tensors, B: int, n: int, H: int):
    """Per-layer [B, n, H * d] tensors as one [B, L, n, H, d] float tensor."""
    import torch

    return torch.stack([t.reshape(B, n, H, -1) for t in tensors], 1).float()


def _tile_batch(t, k: int):
    """A batch tensor repeated ``k`` times along its first dimension (block after block)."""
    return t.repeat(k, *[1] * (t.ndim - 1)) if k > 1 and t is not None else t


def _tile_inputs(inputs: dict, k: int) -> dict:
    """Model inputs with every batch tensor tiled ``k`` times; ``logits_to_keep`` (positions, not rows) kept."""
    return {key: t if key == "logits_to_keep" else _tile_batch(t, k) for key, t in inputs.items()}


def _bucketed(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    return length_batches(lengths, batch_size)


def lm_evaluation(
    spec, loc: str, kwargs: dict, records, n_sequences: int, max_tokens: int, batch_size: int, device: str = "cpu"
):
    """(Evaluation, None) for a decoder with a causal-LM head, else (None, reason)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(loc, **kwargs)
    kind = model_kind(config, spec)
    model, reason = lm_head_model(loc, kind, kwargs, spec, device)  # on device, or split by its device_map
    if model is None:
        return None, reason
    if kind != "decoder":
        return None, "an encoder: the loss ablation measures next-token loss, which needs a causal LM"
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    bos = decoder_bos(tokenizer, config, spec)
    tokenized, _ = tokenize_records(
        records[:n_sequences], tokenizer, kind, min(max_tokens, spec.max_length), "truncate", bos
    )
    tokenized = [t for t in tokenized if len(t) >= 2]
    if not tokenized:
        raise ValueError(f"model {spec.name!r}: no record of the corpus gives a sequence of 2 tokens or more")
    return token_evaluation(model, tokenized, pad_token(tokenizer), batch_size, config), None


def token_evaluation(model, tokenized: list, pad: int, batch_size: int, config) -> Evaluation:
    """The ``lm`` Evaluation of a causal LM (on its device) on tokenised sequences of 2 tokens or more: the
    next-token loss of each, batched by length. ``config``: the model's, for its layers and heads."""
    model.config.use_cache = False  # no key/value cache: batches are expanded inside the model
    batches = []
    for pos in _bucketed([len(t) for t in tokenized], batch_size):
        batch = [tokenized[p] for p in pos]
        inputs = model_inputs(batch, model, pad)
        targets = inputs["input_ids"].clone()
        targets[inputs["attention_mask"] == 0] = -100
        batches.append((inputs, targets, np.asarray(pos)))
    L, H = int(config.num_hidden_layers), int(config.num_attention_heads)
    return Evaluation("lm", model, batches, len(tokenized), L, H)


def classification_evaluation(
    spec, loc: str, kwargs: dict, task: dict | None, n_examples: int, batch_size: int, device: str = "cpu"
):
    """(Evaluation, None) for a fine-tuned classifier whose head is in the checkpoint, else (None, reason); loaded
    as every model-running rule loads (:func:`~headatlas.core.models.from_pretrained`: on ``device``, or split
    by the model's ``device_map``), in float32."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if task is None:
        return None, "not a fine-tuned classifier (no finetuned source in the config)"
    model, info = from_pretrained(
        AutoModelForSequenceClassification, spec, loc, kwargs, device, "float32", output_loading_info=True
    )
    missing = [k for k in info.get("missing_keys", ()) if "classifier" in k or "score" in k]
    if missing:
        return None, f"the checkpoint has no classification head (missing weights: {', '.join(missing[:4])})"
    device = input_device(model)  # the inputs go where the embeddings are
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.bos_token
    dev = tsv_records(task["dev"], task["text_columns"], task["label_column"])[:n_examples]
    to_id = {str(k): int(v) for k, v in model.config.label2id.items()}
    unknown = sorted({r.label for r in dev} - set(to_id))
    if unknown:
        raise ValueError(f"{task['dev']}: labels {unknown[:5]} are not among the model's labels {sorted(to_id)}")
    y = np.array([to_id[r.label] for r in dev])
    max_length = FinetuneSettings.of_task(task).max_length  # the fine-tuning's
    lengths = [len(tokenizer(" ".join(r.words), truncation=True, max_length=max_length)["input_ids"]) for r in dev]
    batches = []
    for pos in _bucketed(lengths, batch_size):
        enc = {k: v.to(device) for k, v in encode_records(tokenizer, [dev[p] for p in pos], max_length).items()}
        batches.append((enc, torch.as_tensor(y[pos], device=device), pos))
    L, H = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    return Evaluation("classification", model, batches, len(dev), L, H), None


def evaluations(
    spec, cache_dir, records, task: dict | None, settings, device: str | None = None
) -> tuple[dict[str, tuple], tuple[int, int]]:
    """task -> (Evaluation, None) or (None, reason why the model is skipped), for both tasks, on ``device``
    (default: the job's, :func:`headatlas.core.device.job_device`); and the model's (layers, heads)."""
    from transformers import AutoConfig

    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    shape = (int(config.num_hidden_layers), int(config.num_attention_heads))
    device = device or job_device(spec.device)
    s = settings
    out = {
        "lm": lm_evaluation(spec, loc, kwargs, records, s.lm_sequences, s.lm_max_tokens, s.batch_size, device),
        "classification": classification_evaluation(
            spec, loc, kwargs, task, s.classification_examples, s.batch_size, device
        ),
    }
    for name, (ev, reason) in out.items():
        if ev is None:
            log.warning("model %s: %s ablation skipped: %s", spec.name, name, reason)
        else:
            log.info("model %s: %s ablation on %d sequences", spec.name, name, ev.n_sequences)
    return out, shape
