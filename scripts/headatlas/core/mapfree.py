"""Map-free attention: per-head statistics from one pass over each layer's scores, without maps.

With s_ij = scale * q_i . k_j (post-rotary) over the keys query i may see (padding and the causal mask exactly
as the model's mask) and A = softmax(s), the model's output A.V comes with LSE_i = log sum_j exp(s_ij), and

- attention to one key per row (a fixed key, an offset, an induction / duplicate target, an arc):
  A[i, t] = exp(s_it - LSE_i) (:attr:`Needs.targets`);
- attention summed over a set of keys given by an indicator m_j: (A.m)_i, one value column (:attr:`Needs.values`);
- the same restricted to keys j <= i (an encoder's "lower" half, e.g. for |i - j|; :attr:`Needs.lower`);
- the row entropy -sum_j A_ij ln A_ij (:attr:`Needs.entropy`), and that of the rows smoothed toward uniform
  (:attr:`Needs.smoothed_entropy`).

Every layer runs :func:`layer_attention`, the same Python on every device: A.V, LSE_i, the row entropy and every
value column from one pass over the scores (an encoder's lower columns and the smoothed entropy too); targets
are one dot product each (:meth:`FreeLayer.attention_to`). Only the kernel under it differs: on CUDA the Triton
pass (:func:`headatlas.core.triton_pass.attention_pass`, every sum in one flash-style pass; the tests run it on a
CPU under Triton's interpreter); on a CPU with ``extraction.cpu_pass: auto`` the C pass
(:func:`headatlas.core.cpu_pass.attention_pass`, built and checked on first use); elsewhere, and for what
those passes do not take (a 4-D mask, the smoothed entropy, a gradient), :func:`kernel_order`: a layer with
sums goes to :func:`blocked_attention` (torch products per block of rows; a fused kernel would take them as values widened to
[V | K | key columns], H_i = LSE_i - scale q_i . (A K)_i, measured slower), A.V and LSE alone to a fused kernel
(the CPU flash kernel; on CUDA the flash or memory-efficient kernel), one that fails falling back to the next
(said once in the log) and the blocked products last. A fused kernel gives no smoothed entropy:
:meth:`FreeLayer.smoothed_entropy` recomputes rows.

No [B, H, n, n] map exists. The model runs through transformers' attention-function registry
(:data:`MAPFREE`, registered with ``AttentionInterface`` and the SDPA mask function), switched on a loaded model
with ``set_attn_implementation`` while a :class:`MapFreeFeed` is open and back to eager after it.

Every reducer reads a layer through a :class:`~headatlas.core.layer_view.LayerView`: here a :class:`FreeLayer`
(the eager and replay feeds hand it a :class:`~headatlas.core.layer_view.MapsLayer`); one that needs the maps
themselves says why in ``full_rows``.
:func:`plan_feed` picks the map-free feed when every reducer has a map-free form and the model type's score is
bilinear (:func:`mapfree_support`: the ``mapfree`` field of its row of ``core.models.ARCHITECTURES``), else the
eager :class:`~headatlas.core.reduce.FusedFeed` (the reference); :func:`headatlas.core.reduce.open_feed` opens the one it picks and says which and why once in the log.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import numpy as np

from . import cpu_pass, triton_pass
from .device import input_device
from .layer_view import ROW_CELLS, LayerView, layer_plan, target_ok
from .models import ARCHITECTURES, ModelError
from .reducer import (
    FeedInfo,
    ReduceBatch,
    ReduceError,
    Reducer,
    feed_outputs,
    reducer_failure,
    release_scratch,
    scratch,
    stop_all,
)

log = logging.getLogger(__name__)

MAPFREE = "headatlas_mapfree"  # the attention implementation's name in transformers' registries


def mapfree_support(config, longest: int = 0) -> str | None:
    """None when a model of ``config`` can go map-free on sequences of up to ``longest`` tokens, else why not (the
    model type's ``mapfree`` in :data:`~headatlas.core.models.ARCHITECTURES`, then this config's options)."""
    arch = ARCHITECTURES.get(getattr(config, "model_type", ""))
    if arch is not None and arch.mapfree is not None:
        return arch.mapfree.why
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "logit soft-capping"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and int(window) < longest:
        return f"sliding window of {window} tokens, shorter than the longest sequence ({longest})"
    return None


# --- the kernel ------------------------------------------------------------------------------------------------


def _additive(mask, dtype):
    """A boolean (True = attend) or additive mask as the additive float mask the kernels take."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def key_only(mask, is_causal: bool):
    """(mask, causal): a boolean mask [B, 1, n, n] (True = attend) that hides padded keys only, or with
    ``is_causal`` padded and later keys, as the key mask [B, 1, 1, n] and the causal flag (the same cells: a
    cheaper call of either kernel and of :func:`blocked_attention`); (``mask``, None) for any other mask."""
    import torch

    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] < 2:
        return mask, None
    n, keys = mask.shape[2], mask[:, :, -1:, :]  # the last row sees every real key
    if mask.shape[3] != n:
        return mask, None
    want = keys & torch.ones(n, n, dtype=torch.bool, device=mask.device).tril() if is_causal else keys
    if not torch.equal(mask, want.expand_as(mask)):
        return mask, None
    return (None if bool(keys.all()) else keys), is_causal


# The private aten ops (no public API returns a fused kernel's LSE beside its output), each with the torch
# versions it was checked on. FlexAttention (torch.nn.attention.flex_attention) is public.
ATEN_OPS = {
    "flash_cpu": ("_scaled_dot_product_flash_attention_for_cpu", "2.11, 2.13 (CPU)"),
    "flash_cuda": ("_scaled_dot_product_flash_attention", "2.11 (CUDA, H200)"),
    "efficient_cuda": ("_scaled_dot_product_efficient_attention", "2.11 (CUDA, H200)"),
}
BLOCKED = "blocked"  # blocked_attention: torch products on any device (widened values; the last fallback)


def kernel_order(device_type: str, dtype, wide: bool = False) -> tuple[str, ...]:
    """The fused kernels :func:`fused_attention` tries on ``device_type`` for inputs of ``dtype``, best first;
    :data:`BLOCKED` after them all. ``wide``: the values are widened beyond the head size (the entropy, key
    columns). The one place a kernel is chosen, by measurement (benchmarks/README.md "GPU")."""
    import torch

    if wide:
        # Widened values (the entropy, key columns): the blocked products on every device, as measured. On an
        # H200 (Qwen2.5-1.5B heads, 8 x 8192) every widened fused call was slower than them (128 ms a layer):
        # FlexAttention took the 257-wide float32 values in slices (1,142 ms) and, past dynamo's recompile limit,
        # ran unfused with the whole score matrix (out of memory at 32768 tokens). On a CPU (one thread) the flash
        # kernel, which takes no value width but the head size, ran with q and k zero-padded: 1.1-1.7x the
        # blocked products' time per layer; the whole map-free forward no faster (docs/mapfree.md).
        return ()
    if device_type == "cuda":  # A.V and LSE alone: the flash kernel (half precision, 7 ms; no mask), then the
        # memory-efficient kernel (14 ms)
        return ("flash_cuda", "efficient_cuda") if dtype in (torch.float16, torch.bfloat16) else ("efficient_cuda",)
    if device_type == "cpu":  # compiled FlexAttention on a CPU returns no LSE (torch 2.13)
        return ("flash_cpu",)
    return ()


_FAILED: dict = {}  # (kernel, device type, dtype) -> why it failed: said once in the log, not tried again
_SPLIT: set = set()  # (kernel, device type, dtype) that failed on values wider than the head size: split them
_FLEX: dict = {}  # "fn": the compiled flex_attention; "masks": [(mask object, causal, n, BlockMask, score_mod)]


def _pad(x, width: int):
    import torch

    return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def _aten(name: str):
    import torch

    return getattr(torch.ops.aten, ATEN_OPS[name][0])


def _expand(q, k, v):
    """k, v with their grouped heads repeated to q's (kernels without grouped heads)."""
    g = q.shape[1] // k.shape[1]
    return (k, v) if g == 1 else (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))


def _flex_call(q, k, v, mask, causal: bool, scale: float):
    import torch
    from torch.nn.attention import flex_attention as fa

    if "fn" not in _FLEX:  # compiled on a GPU (its first call per shape compiles); eager elsewhere (tests)
        _FLEX["fn"] = torch.compile(fa.flex_attention) if q.device.type == "cuda" else fa.flex_attention
    bsz, _, n, _ = q.shape
    masks = _FLEX.setdefault("masks", [])  # the last few (a layer's full and causal calls), by the mask object
    key = next((x for x in masks if x[0] is mask and x[1:3] == (causal, n)), None)
    if key is None:
        block, score = None, None
        if mask is not None and mask.shape[-2] == 1:  # keys only: a block mask (skips padded blocks)
            keys = torch.isfinite(mask[:, 0, 0]) if mask.dtype != torch.bool else mask[:, 0, 0]

            def visible(b, h, qi, kv):
                return keys[b, kv] & (qi >= kv) if causal else keys[b, kv]

            block = fa.create_block_mask(visible, bsz, None, n, n, device=q.device)
        elif causal:
            block = fa.create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, n, n, device=q.device)
        if mask is not None and mask.shape[-2] != 1:  # any other additive mask: added to the scores
            per_head = mask.shape[1] != 1
            bias = _additive(mask, q.dtype).expand(bsz, mask.shape[1], n, n)

            def score(s, b, h, qi, kv):
                return s + bias[b, h if per_head else 0, qi, kv]

        key = (mask, causal, n, block, score)
        masks[:] = [key, *masks[:3]]
    kw = {"score_mod": key[4], "block_mask": key[3], "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if hasattr(fa, "AuxRequest"):
        out, aux = _FLEX["fn"](q, k, v, return_aux=fa.AuxRequest(lse=True), **kw)
        return out, aux.lse
    return _FLEX["fn"](q, k, v, return_lse=True, **kw)


def _kernel_call(name: str, q, k, v, mask, causal: bool, scale: float):
    """(out [B, H, n, w], LSE [B, H, n]) of kernel ``name``; the value width w equal to the head size unless
    the kernel takes others. ``mask``: additive float or boolean (True = attend), None; ``causal``."""
    import torch

    if name == "flex":
        return _flex_call(q, k, v, mask, causal, scale)
    additive = _additive(mask, q.dtype)
    if name == "flash_cpu":
        return _aten(name)(q, k, v, 0.0, causal, attn_mask=additive, scale=scale)[:2]
    k, v = _expand(q, k, v)
    if name == "flash_cuda":
        if additive is not None:
            raise NotImplementedError("the flash kernel takes no mask")
        return _aten(name)(q, k, v, 0.0, causal, False, scale=scale)[:2]
    if name != "efficient_cuda":
        raise NotImplementedError(f"no kernel {name!r}")
    # the efficient kernel: a float bias whose rows are 16-aligned (expanded, not copied), LSE padded to 32 rows
    bias = None
    if additive is not None:
        n = additive.shape[-1]
        if n % 16:  # every stride of the bias a multiple of 16 (it checks the batch stride too)
            additive = torch.nn.functional.pad(additive, (0, 16 - n % 16))[..., :n]
        bias = additive.expand(q.shape[0], q.shape[1], q.shape[2], n)
    out, lse = _aten(name)(q, k, v, bias, True, 0.0, causal, scale=scale)[:2]
    return out, lse[..., : q.shape[2]]


def _run(name: str, q, k, v, mask, causal: bool, scale: float, split: bool):
    """:func:`_kernel_call` for a value width w of any size: one call with q, k zero-padded to w (the CPU flash
    kernel: a wider product, one pass), with v as it is (FlexAttention, the efficient kernel), or, ``split``
    (the flash kernel; a kernel that failed on wide values), one call per head-size slice of v."""
    d, w = q.shape[-1], v.shape[-1]
    if w == d:
        out, lse = _kernel_call(name, q, k, v, mask, causal, scale)
    elif name == "flash_cpu":
        width = max(d, -(-w // 8) * 8)
        out, lse = _kernel_call(name, _pad(q, width), _pad(k, width), _pad(v, width), mask, causal, scale)
    elif split or name == "flash_cuda":
        import torch

        parts = [_kernel_call(name, q, k, _pad(v[..., i : i + d], d), mask, causal, scale) for i in range(0, w, d)]
        out, lse = torch.cat([p[0] for p in parts], -1), parts[0][1]
    else:
        out, lse = _kernel_call(name, q, k, v, mask, causal, scale)
    return out[..., :w], lse.float()


def fused_attention(q, k, v, mask, causal: bool, scale: float, ran: set | None = None):
    """(A.v [B, H, n, w], LSE [B, H, n] float32) from the first fused kernel of :func:`kernel_order` that
    works here, or None when none does (the caller falls back to :func:`blocked_attention`). q [B, H, n, d], k
    [B, Hkv, n, d], v [B, Hkv, n, w] (grouped heads not expanded; any value width); ``mask``: additive float,
    boolean or None, with ``causal`` or without. A kernel that fails (missing on this torch build or device,
    or refusing the shapes) is said once in the log and not tried again; ``ran`` gets the name of the one that
    ran."""

    for name in kernel_order(q.device.type, q.dtype, v.shape[-1] > q.shape[-1]):
        key = (name, q.device.type, q.dtype)
        if key in _FAILED:
            continue
        out, why = _try(_run, name, q, k, v, mask, causal, scale, key in _SPLIT)
        if out is None and v.shape[-1] > q.shape[-1] and key not in _SPLIT and name != "flash_cpu":
            out, _ = _try(_run, name, q, k, v, mask, causal, scale, True)  # head-size slices
            if out is not None:
                _SPLIT.add(key)
                log.warning("map-free attention: kernel %s refused values %d wide (%s); it takes them in slices "
                            "of %d from now on", name, v.shape[-1], why, q.shape[-1])  # fmt: skip
        if out is None:
            _failed(key, why)
            continue
        if ran is not None:
            ran.add(name)
        return out
    return None


def _try(call, *args):
    """(``call(*args)``, None) or (None, why it failed); running out of memory is raised."""
    import torch

    try:
        return call(*args), None
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 (a kernel missing or refusing the shapes: the caller tries the next)
        return None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


def _failed(key: tuple, why: str) -> None:
    """Kernel ``key`` = (name, device type, dtype) failed: said once in the log, not tried again."""
    _FAILED[key] = why
    log.warning("map-free attention: kernel %s (%s, %s) failed: %s; the next one is used from now on",
                key[0], key[1], str(key[2]).removeprefix("torch."), why)  # fmt: skip


def attention_lse(q, k, v, mask, causal: bool, scale: float, ran: set | None = None):
    """(A.v [B, H, n, dv] in v's dtype, LSE [B, H, n] float32): :func:`layer_attention` without statistics
    (in q's dtype: the model's own call when no feed is open); ``k``, ``v`` may have fewer (grouped) heads."""
    got = fused_attention(q, k, v, mask, causal, scale, ran)
    if got is None:
        if ran is not None:
            ran.add(BLOCKED)
        return blocked_attention(q, k, v, _additive(mask, q.dtype), causal, scale)[:2]
    return got[0].to(v.dtype), got[1]


def layer_attention(
    q,
    k,
    v,
    mask,
    causal: bool,
    scale: float,
    cols=None,
    lcols=None,
    entropy: bool = False,
    later_masked: bool = False,
    ran: set | None = None,
    smoothing: float | None = None,
    c_pass: bool = False,
):
    """One map-free layer on any device: (A.v [B, H, n, dv] in v's dtype, LSE [B, H, n], {"values": A.cols
    [B, H, n, C], "lower": sum_{j <= i} A_ij lcols_j [B, H, n, C'], "entropy": -sum_j A_ij ln A_ij [B, H, n],
    "smoothed_entropy": the entropy of the rows (1 - smoothing) A + smoothing / k_i over each row's k_i visible
    keys}, the asked ones), float32. With a key mask or none, no gradient to keep and no smoothed entropy, where
    Triton runs (:func:`~headatlas.core.triton_pass.usable`: CUDA): from
    :func:`~headatlas.core.triton_pass.attention_pass`. ``c_pass`` (``extraction.cpu_pass: auto``), on a CPU with
    a key mask or none and no gradient to keep: from :func:`~headatlas.core.cpu_pass.attention_pass` where it
    loads (every sum from one loop over the scores). Otherwise from one :func:`fused_attention` call in float32
    with the values widened to [v | k | cols]: its output gives A.v, (A k)_i and the value columns, and the row entropy is
    H_i = LSE_i - sum_j A_ij s_ij = LSE_i - scale q_i . (A k)_i. An encoder's lower columns come from a second,
    causal call over them, rescaled by exp(LSE_causal - LSE) (the causal rows' mass of the full row); under a
    causal mask they are value columns. q [B, H, n, d], k [B, Hkv, n, d], v [B, Hkv, n, dv] (grouped heads
    not expanded); ``cols``, ``lcols``: [B, 1, n, C] key columns; ``mask``: additive float (0 or -inf) or
    None, with ``causal`` or without. Where :func:`kernel_order` names no fused kernel (widened values, on every
    device, as measured) or none works, and for the smoothed entropy: :func:`blocked_attention`
    (``later_masked``: its row trimming). ``ran`` gets the name of each kernel that ran."""
    import torch

    keys = mask is None or (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1)
    grad = any(x.requires_grad for x in (q, k, v))  # the passes have no backward: torch's paths do
    if keys and not grad and smoothing is None and triton_pass.usable(q.device):
        got = _triton_pass(q, k, v, mask, causal, scale, cols, lcols, entropy)
        if got is not None:
            if ran is not None:
                ran.add(triton_pass.NAME)
            return got
    if c_pass and q.device.type == "cpu" and keys and not grad and cpu_pass.library() is not None:
        out, lse, got = cpu_pass.attention_pass(
            q, k, v, *_pass_inputs(mask, cols, lcols, causal, scale), entropy, smoothing
        )
        if ran is not None:
            ran.add(cpu_pass.NAME)
        return out.transpose(1, 2), lse, got
    f32 = torch.float32
    bsz, h, n, d = q.shape
    hk, dv = k.shape[1], v.shape[-1]
    wide = [] if cols is None else [cols]
    if causal and lcols is not None:  # every visible key is j <= i: lower columns are value columns
        wide.append(lcols)
    parts = [v, k] if entropy else [v]
    parts += [c.expand(bsz, hk, n, -1) for c in wide]
    qf, kf = q.to(f32), k.to(f32)
    got = None
    if smoothing is None:  # (the smoothed rows need every cell: no fused kernel gives them)
        got = fused_attention(qf, kf, torch.cat([p.to(f32) for p in parts], -1), mask, causal, scale, ran)
    low = None
    if got is not None and lcols is not None and not causal:  # the causal rows' sums, then their share
        cmask, ccausal = mask, True
        if mask is not None and mask.shape[-2] != 1:  # a 4-D mask: the causal triangle put into it
            later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            cmask, ccausal = _additive(mask, f32).masked_fill(later, -math.inf), False
        low = fused_attention(qf, kf, lcols.to(f32).expand(bsz, hk, n, -1), cmask, ccausal, scale, ran)
    if got is None or (lcols is not None and not causal and low is None):
        if ran is not None:
            ran.add(BLOCKED)
        return blocked_attention(
            q, k, v, _additive(mask, f32), causal, scale, cols, lcols, entropy, later_masked, smoothing=smoothing
        )
    out, lse = got
    res, at = {}, dv
    if entropy:
        res["entropy"] = lse - scale * torch.linalg.vecdot(qf, out[..., dv : dv + d])
        at += d
    for name, c in zip(("values", "lower"), wide):
        res[name] = out[..., at : at + c.shape[-1]]
        at += c.shape[-1]
    if low is not None:
        res["lower"] = low[0] * torch.exp(low[1] - lse)[..., None]
    return out[..., :dv].to(v.dtype), lse, res


def _pass_inputs(mask, cols, lcols, causal: bool, scale: float) -> tuple:
    """The attention passes' (C and Triton) arguments after q, k, v: the key mask [B, n], the flag, the scale and
    the key columns [B, n, C] from the layer's [B, 1, 1, n] mask and [B, 1, n, C] columns."""
    return (
        None if mask is None else mask[:, 0, 0],
        causal,
        scale,
        *(None if c is None else c[:, 0] for c in (cols, lcols)),
    )


def _triton_pass(q, k, v, mask, causal: bool, scale: float, cols, lcols, entropy: bool):
    """:func:`~headatlas.core.triton_pass.attention_pass` of a layer with a key mask or none, or None where it
    failed here (:func:`_failed`)."""
    key = (triton_pass.NAME, q.device.type, q.dtype)
    if key in _FAILED:
        return None
    got, why = _try(triton_pass.attention_pass, q, k, v, *_pass_inputs(mask, cols, lcols, causal, scale), entropy)
    if got is None:
        _failed(key, why)
    return got


LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def blocked_attention(
    q,
    k,
    v,
    mask,
    causal: bool,
    scale: float,
    cols=None,
    lcols=None,
    entropy=False,
    later_masked=False,
    cells: int | None = None,
    smoothing: float | None = None,
):
    """The layer's attention and its statistics' passes in row blocks of at most about ``cells`` cells, from q
    [B, H, n, d] and k, v [B, Hkv, n, .] (grouped heads not expanded): per block of query rows one product
    s = scale q.k (as log2(e) s), the row max, 2^(s - max), their sum z, one product of those with v
    and one with the key columns, so the scores and exponentials are computed once for the model's output and
    every column.
    Returns (A.v [B, H, n, dv] in v's dtype, LSE [B, H, n], {"values": A.cols [B, H, n, C], "lower": sum_{j <= i}
    A_ij lcols_j [B, H, n, C'], "entropy": -sum_j A_ij ln A_ij [B, H, n], "smoothed_entropy": -sum_j P_ij ln P_ij
    over each row's k_i visible keys, P = (1 - ``smoothing``) A + ``smoothing`` / k_i}, only the asked ones); ``cols``,
    ``lcols``: [B, 1, n, C] key columns (the same for every head). ``mask``: additive float or None, with
    ``causal`` or without; ``later_masked``: the mask hides every key after the
    query (a decoder's padded batch), so a block stops at its last row's key. Never more than a block of cells
    is held (two reused :func:`~headatlas.core.reducer.scratch` buffers; ``cells`` None: 2^20 on a CPU, about
    its cache, 2^26 on a GPU)."""
    import torch

    bsz, h, n, d = q.shape
    hk, dv = k.shape[1], v.shape[-1]
    g = h // hk
    dev = q.device
    cells = (2**20 if dev.type == "cpu" else 2**26) if cells is None else cells
    trim = causal or later_masked
    qs = (q.float() * (scale * LOG2E)).reshape(bsz, hk, g, n, d)
    kt = k.float().reshape(bsz * hk, n, d).transpose(1, 2)  # [B * Hkv, d, n]
    vf = v.float().reshape(bsz * hk, n, dv)
    # key columns as [B, C, n]: their product with the weights as C x keys times keys x rows (5x faster than
    # rows x keys times keys x C for a few columns, measured with MKL)
    ct = None if cols is None else cols.float()[:, 0].transpose(1, 2).contiguous()
    lt = None if lcols is None else lcols.float()[:, 0].transpose(1, 2).contiguous()
    init = None
    if mask is not None:  # in log2 units, finite (0 * -inf would be nan in the entropy's sum)
        mask = (mask.float() * LOG2E).clamp_(min=-1e30)
        if mask.shape[1] == 1 and mask.shape[2] == 1:  # keys only: the products' initial value
            init = mask.expand(bsz, hk, 1, n).reshape(bsz * hk, 1, n)
            mask = None
        else:
            per_head = mask.shape[1] == h
            mask = mask.reshape(mask.shape[0], hk if per_head else 1, g if per_head else 1, *mask.shape[2:])
    out = torch.empty((bsz * hk, g, n, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((bsz * hk, g, n), dtype=torch.float32, device=dev)
    ent = torch.empty((bsz * hk, g, n), dtype=torch.float32, device=dev) if entropy else None
    sment = None if smoothing is None else torch.empty((bsz * hk, g, n), dtype=torch.float32, device=dev)
    val = None if ct is None else torch.empty((bsz, ct.shape[1], hk, g, n), dtype=torch.float32, device=dev)
    low = None if lt is None else torch.empty((bsz, lt.shape[1], hk, g, n), dtype=torch.float32, device=dev)
    per_row = max(1.0, cells / (bsz * h))  # cells of one query row of every head: its keys
    lo = 0
    while lo < n:
        if trim:  # rows m with m (lo + m) cells each: m^2 + lo m = per_row
            m = int((math.sqrt(lo * lo + 4 * per_row) - lo) / 2)
        else:
            m = int(per_row // n)
        m = max(1, min(n - lo, m))
        hi = lo + m
        t = hi if trim else n
        qb = qs[:, :, :, lo:hi].reshape(bsz * hk, g * m, d)
        buf = scratch("blocked_s", (bsz * hk, g * m, t), dev)
        s = (
            torch.bmm(qb, kt[:, :, :t], out=buf)
            if init is None
            else torch.baddbmm(init[..., :t], qb, kt[:, :, :t], out=buf)
        )
        s5 = s.view(bsz, hk, g, m, t)
        if mask is not None:
            s5.add_(mask[..., :t] if mask.shape[-2] == 1 else mask[..., lo:hi, :t])
        if causal:
            s5[..., lo:hi].add_(torch.full((m, m), -1e30, device=dev).triu_(1))
        if sment is not None:  # each row's visible keys (hidden cells score about -1e30)
            seen = (s > -1e29).sum(-1, keepdim=True).clamp_(min=1)
        mx = s.amax(-1, keepdim=True)
        s.sub_(mx)
        e = torch.exp2(s, out=scratch("blocked_e", s.shape, dev))
        z = e.sum(-1, keepdim=True)
        r = 1.0 / z  # [B * Hkv, g * m, 1]
        out[:, :, lo:hi] = torch.bmm(e, vf[:, :t]).mul_(r).view(bsz * hk, g, m, dv)
        lz = z[..., 0].log2()
        lse[:, :, lo:hi] = (mx[..., 0] + lz).mul_(LN2).view(bsz * hk, g, m)
        if entropy:  # -sum A ln A = ln 2 (log2 z - sum_j e_j (s_j - max) / z)
            ent[:, :, lo:hi] = (lz - torch.linalg.vecdot(e, s) * r[..., 0]).mul_(LN2).view(bsz * hk, g, m)
        if sment is not None:  # every cell of the block as P, then its hidden ones (e = 0, P = c0) taken back out
            c0 = smoothing / seen
            p = torch.addcmul(c0, e, r * (1 - smoothing), out=scratch("blocked_s", s.shape, dev))
            hidden = (t - seen) * torch.xlogy(c0, c0)
            sment[:, :, lo:hi] = (torch.special.entr(p).sum(-1, keepdim=True) + hidden).view(bsz * hk, g, m)
        et = e.view(bsz, hk * g * m, t).transpose(1, 2)  # [B, t, rows of every head]
        rb = r.view(bsz, 1, hk, g, m)
        if ct is not None:
            val[..., lo:hi] = torch.bmm(ct[:, :, :t], et).view(bsz, -1, hk, g, m).mul_(rb)
        if lt is not None:  # keys before the block, then the block's own square (j <= i)
            sq = (
                et[:, lo:hi]
                .reshape(bsz, m, hk * g, m)
                .mul(torch.ones(m, m, dtype=torch.bool, device=dev).triu()[:, None])
            )
            part = torch.matmul(lt[:, None, :, lo:hi], sq.permute(0, 2, 1, 3))  # [B, hk * g, C', m]
            part = part.permute(0, 2, 1, 3).reshape(bsz, -1, hk * g * m)
            if lo:
                part += torch.bmm(lt[:, :, :lo], et[:, :lo])
            low[..., lo:hi] = part.view(bsz, -1, hk, g, m).mul_(rb)
        lo = hi
    got = {}
    if cols is not None:
        got["values"] = val.view(bsz, -1, h, n).permute(0, 2, 3, 1)
    if lcols is not None:
        got["lower"] = low.view(bsz, -1, h, n).permute(0, 2, 3, 1)
    if entropy:
        got["entropy"] = ent.view(bsz, h, n)
    if sment is not None:
        got["smoothed_entropy"] = sment.view(bsz, h, n)
    return out.view(bsz, h, n, dv).to(v.dtype), lse.view(bsz, h, n), got


FEED_ATTR = "_headatlas_mapfree_feed"  # the open MapFreeFeed, on every module of its model while it is open


def mapfree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: the fused kernel's output (as the SDPA forward's), and the
    layer's q, k, LSE handed to the reducers of the :class:`MapFreeFeed` open on the module's model (the feed
    marks the model's modules, :data:`FEED_ATTR`). Returns no weights."""
    for arg in ("softcap", "position_bias", "sliding_window"):
        if kwargs.get(arg) is not None:
            raise ModelError(f"map-free attention: {type(module).__name__} passes {arg}; its type must run eager")

    if dropout and module.training:
        raise ModelError("map-free attention: dropout in training mode; load the model in eval mode")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    feed = getattr(module, FEED_ATTR, None)
    feed = feed if feed is not None and feed.batch is not None else None
    if feed is None:
        mask, causal = _additive(attention_mask, query.dtype), None
    else:  # every layer gets the same mask: simplified once per forward
        mask, causal = feed.mask(attention_mask, bool(is_causal), query.dtype)
    if causal is None:
        causal = bool(query.shape[2] > 1 and mask is None and is_causal)
    if feed is None:
        return attention_lse(query, key, value, mask, causal, scale)[0].transpose(1, 2).contiguous(), None
    return feed.attend(query, key, value, mask, causal, scale), None


def register() -> None:
    """Register :data:`MAPFREE` with transformers' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(MAPFREE, mapfree_attention)
    AttentionMaskInterface.register(MAPFREE, sdpa_mask)


# --- the map-free backend of the layer view ---------------------------------------------------------------------


class FreeLayer(LayerView):
    """The :class:`~headatlas.core.layer_view.LayerView` of one layer of one batch without its maps: q [B, H, n,
    d], k [B, Hkv, n, d] (grouped heads not expanded; kept in float32), lse [B, H, n], ``scale``, and the
    declared passes. ``targets``: name -> [B, n] key of each query (-1: none), their attention computed here
    from q, k and LSE (on every device); ``smoothed``: (eps, [B, H, n]) the smoothed rows' entropy when the
    attention pass computed it, else it is computed here too. Every method returns 0 on padded query rows."""

    def __init__(self, q, k, lse, scale, batch, causal, values, lower, entropy, targets=None, smoothed=None):
        # float32 whatever the model's dtype: every score and sum of the statistics is taken in float32
        self.q, self.k, self.lse, self.scale, self.batch, self.causal = q.float(), k.float(), lse, scale, batch, causal
        self._values, self._lower, self._entropy, self._smoothed = values, lower, entropy, smoothed
        self.valid = batch.masks(q.device, causal)["valid"]  # [B, n]
        self._targets = self.attention_to(targets) if targets else {}  # every declared target at once

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.lse.shape)

    @property
    def device(self):
        return self.q.device

    def attention_to(self, targets: dict) -> dict:
        """name -> [B, H, n] attention of each query i to its key of every target of ``targets`` (name -> [B, n]
        keys, -1: none; 0 where none, outside the sequence, after i under a causal mask, and on padded rows):
        exp(scale q_i . k_t - LSE_i). The score products by kind: a target named ``offset:<o>`` (key i + o)
        from q against the shifted keys, ``key:<j>`` from q against that key, every other by an index of the
        keys; then one exponential and one mask for them all."""
        import torch

        bsz, h, n, d = self.q.shape
        s = torch.empty((bsz, h, len(targets), n), dtype=torch.float32, device=self.q.device)
        for i, (name, t) in enumerate(targets.items()):
            if name.startswith("offset:"):
                self._shifted_scores(int(name[7:]), s[:, :, i])
            elif name.startswith("key:"):
                self._column_scores(int(name[4:]), s[:, :, i])
            else:
                self._indexed_scores(t, s[:, :, i])
        ok = target_ok(self.batch, targets, self.causal, self.q.device)
        # clamped at 0: cells a query may not see can score far above its LSE (finite for the mask)
        a = s.mul_(self.scale).sub_(self.lse[:, :, None]).clamp_(max=0).exp_().mul_(ok[:, None])
        return {name: a[:, :, i] for i, name in enumerate(targets)}

    def _shifted_scores(self, offset: int, out) -> None:
        """q_i . k_{i + offset} into ``out`` [B, H, n] (0 where that key does not exist): one product of q with
        the shifted keys, no index."""
        bsz, h, n, d = self.q.shape
        hk = self.k.shape[1]
        lo, hi = max(0, -offset), min(n, n - offset)  # queries whose key i + offset is inside 0..n-1
        if hi <= lo or (self.causal and offset > 0):
            out.zero_()
            return
        out[:, :, :lo].zero_()
        out[:, :, hi:].zero_()
        q = self.q[:, :, lo:hi].reshape(bsz, hk, h // hk, hi - lo, d)
        k = self.k[:, :, lo + offset : hi + offset, None].transpose(2, 3)  # [B, Hkv, 1, m, d]
        out[:, :, lo:hi] = _dot(q, k).view(bsz, h, -1)

    def _column_scores(self, j: int, out) -> None:
        """q_i . k_j of every query into ``out`` [B, H, n] (0 if there is no key j), by :func:`_dot` (a matrix
        product [n, d] x [d, 1] per head costs a CPU 3x more)."""
        bsz, h, n, d = self.q.shape
        hk = self.k.shape[1]
        if not 0 <= j < n:
            out.zero_()
            return
        out.copy_(_dot(self.q.reshape(bsz, hk, (h // hk) * n, d), self.k[:, :, j, None]).view(bsz, h, n))

    def _indexed_scores(self, target, out) -> None:
        """q_i . k_{target[b, i]} ([B, n] ints; -1 scores against key 0) into ``out`` [B, H, n]: the target keys'
        rows by one index_select of the flattened keys (a gather with an index per element is 40x slower on a
        CPU), then a product and a sum (grouped heads: every query head of a key head against its rows)."""
        import torch

        bsz, h, n, d = self.q.shape
        hk = self.k.shape[1]
        dev = self.q.device
        t = torch.as_tensor(target, device=dev).clamp(min=0)
        base = (torch.arange(bsz, device=dev)[:, None] * hk + torch.arange(hk, device=dev)) * n  # [B, Hkv]
        rows = (base[:, :, None] + t[:, None, :]).reshape(-1)  # [B, Hkv, n]
        keys = torch.index_select(self.k.reshape(-1, d), 0, rows, out=scratch("free_keys", (rows.numel(), d), dev))
        out.copy_(_dot(self.q.reshape(bsz, hk, h // hk, n, d), keys.view(bsz, hk, 1, n, d)).view(bsz, h, n))

    def rows(self, lo: int = 0, hi: int | None = None, seqs=None, keys: int | None = None, slot: str | None = None):
        """[b, H, hi - lo, keys] float32 exact attention rows lo..hi-1 of the sequences ``seqs`` (batch indices;
        None: all) on keys 0..keys-1 (None: all n), exp(scale q_i . k_j - LSE_i) on the cells a query may see
        and 0 elsewhere: a block of the maps recomputed from q, k and LSE, for reducers that need whole rows of
        few sequences (the sample store) or row blocks (:meth:`row_blocks`). Never more than the block is held;
        ``slot``: in that :func:`~headatlas.core.reducer.scratch` buffer (valid until the slot is asked again)."""
        import torch

        hi = self.batch.n if hi is None else hi
        keys = self.batch.n if keys is None else keys
        q, k, lse = self.q[:, :, lo:hi], self.k[:, :, :keys], self.lse[:, :, lo:hi]
        allowed = self.batch.masks(self.q.device, self.causal)["allowed"][:, lo:hi, :keys]
        if seqs is not None:
            sel = torch.as_tensor(np.asarray(seqs, dtype=np.int64), device=q.device)
            q, k, lse, allowed = q[sel], k[sel], lse[sel], allowed[sel]
        a = _exp_scores(*_prescaled(q, lse, self.scale, k.shape[1]), k, slot)
        if self.causal and seqs is None and keys == hi:
            # a real row sees every key before the block: only the block's own square and padded rows need the mask
            a[..., lo:hi].mul_(allowed[:, None, :, lo:hi])
            real = self.valid[:, lo:hi]
            return a if bool(real.all()) else a.mul_(real[:, None, :, None])
        return a.mul_(allowed[:, None])

    def query_rows(self, query):
        """[B, H, P, n] exact rows of the queries ``query`` [B, P] (token index, -1: none) on the cells each may
        see, one dot product per (query, key): :meth:`rows` for a few scattered queries of a long input."""
        import torch

        qi = torch.as_tensor(np.asarray(query, dtype=np.int64), device=self.q.device)  # [B, P]
        bsz, h, n, d = self.q.shape
        hk, p = self.k.shape[1], qi.shape[1]
        take = qi.clamp(min=0)
        q = self.q.gather(2, take[:, None, :, None].expand(bsz, h, p, d))  # [B, H, P, d]
        lse = self.lse.gather(2, take[:, None, :].expand(bsz, h, p))
        allowed = self.batch.masks(self.q.device, self.causal)["allowed"].gather(1, take[:, :, None].expand(bsz, p, n))
        return _exp_scores(*_prescaled(q, lse, self.scale, hk), self.k).mul_((allowed & (qi >= 0)[:, :, None])[:, None])

    def key_mass(self, pos, w, cells: int = ROW_CELLS):
        """[B, H, n, G] sum_t w[b, t, g] A[b, h, i, pos[b, t]]: the attention of every query to a few fixed keys
        per sequence (``pos`` [B, m] key indices, ``w`` [B, m, G] weights) summed in groups, from one product of
        the queries with the m gathered keys (no kernel pass); 0 where a query may not see the key and on padded rows,
        keys in chunks of about ``cells`` cells."""
        import torch

        q, k = self.q, self.k
        bsz, h, n, d = q.shape
        hk, m = k.shape[1], pos.shape[1]
        lengths = self.batch.tensor("lengths", q.device)
        idx = torch.arange(n, device=q.device)
        out = torch.zeros((bsz, h, n, w.shape[-1]), dtype=torch.float32, device=q.device)
        step = max(1, cells // max(1, bsz * h * n))
        scaled = None
        for lo in range(0, m, step):
            p, ww = pos[:, lo : lo + step], w[:, lo : lo + step]
            first = 0  # under a causal mask no query before the chunk's first weighted key sees it
            if self.causal:
                live = (ww != 0).any(-1)
                first = int(p[live].min()) if bool(live.any()) else n
                if first >= n:
                    continue
            if first:
                qs = _prescaled(q[:, :, first:], self.lse[:, :, first:], self.scale, hk)
            else:  # every query: made once for all such chunks
                scaled = _prescaled(q, self.lse, self.scale, hk) if scaled is None else scaled
                qs = scaled
            kt = k.gather(2, p[:, None, :, None].expand(bsz, hk, p.shape[1], d))  # [B, Hkv, t, d]
            ok = self.valid[:, first:, None] & (p < lengths[:, None])[:, None, :]  # [B, n - first, t]
            if self.causal:
                ok &= p[:, None, :] <= idx[None, first:, None]
            out[:, :, first:] += torch.matmul(_exp_scores(*qs, kt, "key_mass").mul_(ok[:, None]), ww[:, None])
        return out

    def target(self, name: str):
        """[B, H, n] attention of each query to its key of a declared ``targets`` row."""
        return self._targets[name]

    def value(self, name: str):
        """[B, H, n, c] (A.m)_i of a declared ``values`` column."""
        return torch_where_valid(self._values[name], self.valid)

    def lower(self, name: str):
        """[B, H, n, c] sum_{j <= i} A_ij m_j of a declared ``lower`` column."""
        return torch_where_valid(self._lower[name], self.valid)

    def entropy(self):
        """[B, H, n] row entropy -sum_j A_ij ln A_ij in nats (the ``entropy`` pass)."""
        import torch

        return torch.where(self.valid[:, None], self._entropy, 0.0)

    def row_sum(self):
        return self.valid[:, None].float().expand(self.shape)

    def smoothed_entropy(self, eps: float, cells: int = ROW_CELLS):
        """The attention pass's smoothed entropies when it computed them with this eps, else
        :meth:`LayerView.smoothed_entropy` from rows recomputed in blocks."""
        import torch

        if self._smoothed is not None and self._smoothed[0] == eps:
            return torch.where(self.valid[:, None], self._smoothed[1], 0.0)
        return super().smoothed_entropy(eps, cells)


def _dot(q, k):
    """q . k over the last dimension (k broadcast to q's shape): a product in one reused buffer and a sum (a
    fresh product per call costs more in page faults than the sum; matrix products per query cost a CPU more)."""
    import torch

    return torch.mul(q, k, out=scratch("free_products", q.shape, q.device)).sum(-1)


def _prescaled(q, lse, scale: float, hk: int):
    """(q [B, H, m, d] times scale log2(e), grouped by key head [B * Hkv, g * m, d]; -log2(e) LSE [B * Hkv, g * m,
    1]; m): the query side of :func:`_exp_scores`, made once for any number of key sets."""
    bsz, h, m, d = q.shape
    qg = (q.float() * (scale * LOG2E)).reshape(bsz * hk, (h // hk) * m, d)
    return qg, (lse.float() * -LOG2E).reshape(bsz * hk, -1, 1), m


def _exp_scores(qg, init, m: int, k, slot: str | None = None):
    """[B, H, m, t] float32 exp(scale q_i . k_j - LSE_i) of :func:`_prescaled` queries against keys k [B, Hkv, t,
    d] (grouped heads not expanded), as 2^(...) from one product whose initial value is the LSE side, clamped at
    1: cells a query may not see can score far above its LSE, the clamp keeps them finite for the caller's mask.
    On a CPU exp2 takes 0.2 ns per cell at any argument, exp 2-10 ns on the very negative arguments of most cells
    of a long row. ``slot``: in that reused :func:`~headatlas.core.reducer.scratch` buffer."""
    import torch

    bsz, hk, t, d = k.shape
    kt = k.float().reshape(bsz * hk, t, d).transpose(1, 2)
    buf = None if slot is None else scratch(slot, (qg.shape[0], qg.shape[1], t), qg.device)
    return torch.baddbmm(init, qg, kt, out=buf).clamp_(max=0).exp2_().view(bsz, -1, m, t)


def torch_where_valid(x, valid):
    import torch

    return torch.where(valid[:, None, :, None], x, 0.0)


# --- the feed ---------------------------------------------------------------------------------------------------


class MapFreeFeed:
    """The map-free counterpart of :class:`~headatlas.core.reduce.FusedFeed` (same begin / end / results): while
    open, the model runs :data:`MAPFREE` attention and every layer's q, k, LSE and declared passes go to the
    reducers' ``update`` (:class:`FreeLayer` views)."""

    def __init__(self, model, reducers: Sequence[Reducer], info: FeedInfo, cpu_pass_mode: str = "auto"):
        if cpu_pass_mode not in cpu_pass.MODES:
            raise ValueError(f"cpu_pass must be one of {cpu_pass.MODES}, not {cpu_pass_mode!r}")
        self.model, self.reducers, self.info, self.cpu_pass_mode = model, list(reducers), info, cpu_pass_mode
        self.batch, self.calls, self.plan, self._mask = None, 0, None, None
        self.kernels: set = set()  # every kernel that computed a layer (the store's metadata)
        self.previous = None
        self.forward_kwargs = {"output_hidden_states": True} if any(r.needs_outputs for r in self.reducers) else {}

    def __enter__(self):
        register()
        for r in self.reducers:
            r.start(self.info)
        self.previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(MAPFREE)
        if self.model.config._attn_implementation != MAPFREE:
            raise ModelError(f"model {self.info.model!r}: cannot switch its attention to {MAPFREE}")
        for m in self.model.modules():  # how mapfree_attention, called with its module, finds this feed
            m.__dict__[FEED_ATTR] = self
        return self

    def begin(self, batch: ReduceBatch) -> None:
        self.batch, self.calls, self._mask = batch, 0, None
        self.plan = layer_plan(self.reducers, batch, self.info.causal, input_device(self.model))

    def mask(self, attention_mask, is_causal: bool, dtype):
        """(additive mask or None, causal flag or None: from the query length) of :func:`key_only`, once per
        forward (the model hands every layer the same mask object)."""
        if self._mask is None or self._mask[0] is not attention_mask:
            m, causal = key_only(attention_mask, is_causal)
            self._mask = (attention_mask, _additive(m, dtype), causal)
        return self._mask[1:]

    def attend(self, q, k, v, mask, causal: bool, scale: float):
        """The layer's attention output [B, n, H, dv] (the layout the model takes back) from
        :func:`layer_attention` (the same Python on every device; on a CPU with ``cpu_pass`` auto its kernel is
        the C pass), and the layer handed to the reducers (:meth:`layer`)."""
        import torch

        p = self.plan
        ours = k.shape[2] == self.batch.n  # (another length: not this batch's sequences, layer() raises)
        # the columns on the layer's device (a model split over devices has its layers on several)
        cols, lcols = (None if x is None or not ours else x.to(q.device)[:, None] for x in (p.values, p.lower))
        if not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
            # q and k (v too for a float32 model) as float32 [B, H, n, d] in reused buffers: the model hands
            # views of its [B, n, H, d] projections, whose strided rows cost the CPU kernel and the views'
            # products more than one copy does (a fresh copy per layer would cost its page faults)
            qf, kf = (scratch(f"free_{x}", t.shape, t.device).copy_(t) for x, t in (("q", q), ("k", k)))
            if q.dtype == torch.float32:
                q, k, v = qf, kf, scratch("free_v", v.shape, v.device).copy_(v)
        else:
            qf, kf = q, k
        out, lse, got = layer_attention(
            q, k, v, mask, causal, scale, cols, lcols, p.entropy and ours, self.info.causal, self.kernels,
            p.smoothing if ours else None, self.cpu_pass_mode == "auto",
        )  # fmt: skip
        self.layer(qf, kf, lse, scale, got)
        return out.transpose(1, 2).contiguous()

    def layer(self, q, k, lse, scale, got) -> None:
        """One layer's q, k, LSE and ``got``: the passes :meth:`attend` computed."""

        layer, batch, info = self.calls, self.batch, self.info
        self.calls += 1
        if q.shape[1] != info.n_heads:
            raise ModelError(
                f"model {info.model!r}: layer {layer + 1} has {q.shape[1]} query heads, expected {info.n_heads}"
            )
        n = batch.n
        if q.shape[2] != n:  # an extra position is not part of the sequences (cut after the kernel)
            raise ModelError(f"model {info.model!r}: {q.shape[2]} positions in the attention, {n} in the batch")
        p = self.plan
        values, lower = p.columns(got.get("values"), got.get("lower"))
        smoothed = None if "smoothed_entropy" not in got else (p.smoothing, got["smoothed_entropy"])
        view = FreeLayer(q, k, lse, scale, batch, info.causal, values, lower, got.get("entropy"), p.targets, smoothed)
        for r in self.reducers:
            try:
                r.update(layer, view, batch)
            except ReduceError:
                raise
            except Exception as e:
                raise reducer_failure(r, info, batch, layer, e) from e

    def end(self, outputs=None) -> None:
        """After the batch's forward pass; ``outputs``: the model's output (for reducers that read it)."""
        if self.batch is not None and self.calls != self.info.n_layers:
            raise ModelError(
                f"model {self.info.model!r}: the map-free attention ran {self.calls} times for {self.info.n_layers} layers"
            )
        if self.batch is not None:
            feed_outputs(self.reducers, self.info, outputs, self.batch)
        self.batch, self.plan, self._mask = None, None, None

    def results(self) -> list:
        return [r.result() for r in self.reducers]

    def __exit__(self, *exc):
        for m in self.model.modules():
            if m.__dict__.get(FEED_ATTR) is self:
                del m.__dict__[FEED_ATTR]
        if self.previous is not None:
            self.model.set_attn_implementation(self.previous)
        self.batch = None
        stop_all(self.reducers)
        release_scratch()
        return False


def has_mapfree(reducer: Reducer) -> bool:
    return getattr(reducer, "full_rows", None) is None


PATHS = ("auto", "eager", "mapfree")


def plan_feed(model, reducers: Sequence[Reducer], longest: int = 0, path: str = "auto") -> tuple[str, str]:
    """("mapfree" | "eager", why): the cheapest feed that serves every reducer on ``model`` (``path`` auto), or
    the one asked for (``mapfree`` fails with the reason when it cannot serve them; ``eager``, or auto falling back
    to it, fails on a model type whose row of :data:`~headatlas.core.models.ARCHITECTURES` says it is not fusable)."""
    if path not in PATHS:
        raise ValueError(f"attention path must be one of {PATHS}, not {path!r}")
    mt = getattr(model.config, "model_type", "")
    arch = ARCHITECTURES.get(mt)
    if path == "eager":
        if arch is not None and arch.fused is not None:
            raise ModelError(f"model type {mt!r}: cannot be reduced fused ({arch.fused.why})")
        return "eager", "asked for"
    why = mapfree_support(model.config, longest)
    if why is None:
        rows = [r for r in reducers if not has_mapfree(r)]
        if rows:
            why = "whole rows needed by " + ", ".join(
                f"{r.name} ({getattr(r, 'full_rows', 'no map-free form')})" for r in rows
            )
    if why is None and not any(True for _ in reducers):
        why = "no reducer"
    if why is None:
        return "mapfree", "every reducer has a map-free form"
    if path == "mapfree":
        raise ModelError(f"model type {mt}: cannot run map-free: {why}")
    if arch is not None and arch.fused is not None:
        raise ModelError(
            f"model type {mt!r}: its attention cannot be reduced while the model runs: not map-free ({why}) and not "
            f"fusable ({arch.fused.why}); only analyses of stored maps (maps: full) read it (docs/models.md "
            "'Supported model types')"
        )
    return "eager", why


def longest_of(tokenized) -> int:
    return int(max((len(t) for t in tokenized), default=0))
