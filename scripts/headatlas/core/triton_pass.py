"""The map-free statistics' attention pass on a GPU: one Triton kernel, flash-attention style.

:func:`attention_pass` computes, in one pass over a layer's scores held in registers block by block, the model's
output A.V and each row's LSE (what the flash kernel returns) and the sums a statistic takes over every cell: the
row entropy, value columns (A.m)_i and lower columns sum_{j <= i} A_ij m_j; the same contract as the CPU's C pass
(:func:`headatlas.core.cpu_pass.attention_pass`) and the blocked torch products
(:func:`headatlas.core.mapfree.blocked_attention`); tests/unit/core/test_mapfree.py checks it against them.
The smoothed entropy, which needs each row's LSE before its cells, is not computed here (the caller falls back).

It runs where Triton runs: a CUDA device, or a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` before
Triton is first imported; tests/conftest.py sets it where there is no CUDA device), which is how the tests run
this kernel's code on machines without a GPU. Scores, the online softmax and every statistic accumulate in float32; q.k and A.V are products in the model's dtype (bf16 / fp16 on
tensor cores, as the flash kernel does; float32 models in full float32), the statistics' columns in float32 to
within ``tf32x3`` products. Under the interpreter every product is float32 (its bf16 products are wrong in
Triton 3.9).

With s_ij in log2 units, m the running row max, l = sum_j 2^(s_ij - m) and e = sum_j 2^(s_ij - m) (s_ij - m),
a new block's max m' rescales them as l' = a l, e' = a (e + l (m - m')) with a = 2^(m - m'); then
LSE = ln 2 (m + log2 l) and the entropy -sum A ln A = ln 2 (log2 l - e / l). A key the mask hides scores -1e30
(log2 units), so a row with no visible key (a padded query row) is uniform over the keys it could see, never NaN.
"""

from __future__ import annotations

import math
import os

try:  # a CUDA build of torch brings Triton; without it (or with one broken against this torch) torch's paths run
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

NAME = "triton_pass"  # its name among the kernels of a store's metadata (core.reduce.feed_record)
LOG2E = 1.4426950408889634


def interpreted() -> bool:
    """Triton's interpreter is on (its kernels run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


ON_CPU = False  # run it on CPU tensors under the interpreter (the tests set it; the interpreter is slow)


def usable(device) -> bool:
    """This kernel runs on tensors of ``device`` here: Triton is installed and the device is CUDA, or a CPU
    under the interpreter with :data:`ON_CPU` set."""
    kind = getattr(device, "type", device)
    if kind == "cpu":
        return ON_CPU and interpreted() and triton is not None
    return kind == "cuda" and triton is not None


if triton is not None:  # the kernel at module level: its globals are what Triton's interpreter patches
    HIDDEN = tl.constexpr(-1.0e30)  # a hidden key's score (log2 units)
    LN2 = tl.constexpr(0.6931471805599453)

    @triton.jit
    def attention_pass_kernel(
        Q, K, V, KEYS, X, L, OUT, LSE, ENT, XOUT, LOUT,
        sqb, sqh, sqi, skb, skh, ski, svb, svh, svi, sxb, sxi, slb, sli,
        H, G, N, D, DV, C, CL, qk_scale,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        BLOCK_C: tl.constexpr, BLOCK_CL: tl.constexpr, CAUSAL: tl.constexpr, HAS_KEYS: tl.constexpr,
        ENTROPY: tl.constexpr, HAS_X: tl.constexpr, HAS_L: tl.constexpr, F32_DOTS: tl.constexpr,
        QK_PRECISION: tl.constexpr,
    ):  # fmt: skip
        start = tl.program_id(0) * BLOCK_M
        # a head's and a sequence's base offsets in 64 bits (a layer can pass 2^31 elements), within them 32
        bh = tl.program_id(1).to(tl.int64)
        b = bh // H
        h = bh % H
        hk = h // G
        rows = start + tl.arange(0, BLOCK_M)
        dd = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        live = rows < N
        q = tl.load(
            Q + b * sqb + h * sqh + rows[:, None] * sqi + dd[None, :],
            mask=live[:, None] & (dd < D)[None, :],
            other=0.0,
        )
        if F32_DOTS:
            q = q.to(tl.float32)
        m = tl.full([BLOCK_M], HIDDEN, tl.float32)
        z = tl.zeros([BLOCK_M], tl.float32)
        e = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        cx = tl.arange(0, BLOCK_C)
        cl = tl.arange(0, BLOCK_CL)
        xacc = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
        lacc = tl.zeros([BLOCK_M, BLOCK_CL], tl.float32)
        stop = tl.minimum(start + BLOCK_M, N) if CAUSAL else N
        for lo in range(0, stop, BLOCK_N):
            cols = lo + tl.arange(0, BLOCK_N)
            here = cols < N
            kt = tl.load(
                K + b * skb + hk * skh + cols[None, :] * ski + dd[:, None],
                mask=here[None, :] & (dd < D)[:, None],
                other=0.0,
            )
            if F32_DOTS:
                kt = kt.to(tl.float32)
            s = tl.dot(q, kt, input_precision=QK_PRECISION) * qk_scale
            # cells past the sequence's end or after the query (causal) are not in the row; hidden keys score HIDDEN
            seen = here[None, :] & (rows[:, None] >= cols[None, :]) if CAUSAL else here[None, :]
            ok = seen
            if HAS_KEYS:
                ok = ok & (tl.load(KEYS + b * N + cols, mask=here, other=0) != 0)[None, :]
            s = tl.where(ok, s, HIDDEN)
            m2 = tl.maximum(m, tl.max(s, 1))
            a = tl.exp2(m - m2)
            p = tl.where(seen, tl.exp2(s - m2[:, None]), 0.0)
            if ENTROPY:
                e = a * (e + z * (m - m2)) + tl.sum(p * (s - m2[:, None]), 1)
            z = z * a + tl.sum(p, 1)
            v = tl.load(
                V + b * svb + hk * svh + cols[:, None] * svi + dv[None, :],
                mask=here[:, None] & (dv < DV)[None, :],
                other=0.0,
            )
            if F32_DOTS:
                acc = acc * a[:, None] + tl.dot(p, v.to(tl.float32), input_precision=QK_PRECISION)
            else:
                acc = acc * a[:, None] + tl.dot(p.to(v.dtype), v, input_precision=QK_PRECISION)
            if HAS_X:
                xv = tl.load(
                    X + b * sxb + cols[:, None] * sxi + cx[None, :], mask=here[:, None] & (cx < C)[None, :], other=0.0
                )
                xacc = xacc * a[:, None] + tl.dot(p, xv, input_precision="tf32x3")
            if HAS_L:
                lv = tl.load(
                    L + b * slb + cols[:, None] * sli + cl[None, :], mask=here[:, None] & (cl < CL)[None, :], other=0.0
                )
                pl = tl.where(rows[:, None] >= cols[None, :], p, 0.0)
                lacc = lacc * a[:, None] + tl.dot(pl, lv, input_precision="tf32x3")
            m = m2
        r = 1.0 / z
        row = bh * N  # this head's first row in the outputs
        tl.store(LSE + row + rows, (m + tl.log2(z)) * LN2, mask=live)
        if ENTROPY:
            tl.store(ENT + row + rows, (tl.log2(z) - e * r) * LN2, mask=live)
        o = acc * r[:, None]
        tl.store(
            OUT + row * DV + rows[:, None] * DV + dv[None, :],
            o.to(OUT.dtype.element_ty),
            mask=live[:, None] & (dv < DV)[None, :],
        )
        if HAS_X:
            tl.store(
                XOUT + row * C + rows[:, None] * C + cx[None, :],
                xacc * r[:, None],
                mask=live[:, None] & (cx < C)[None, :],
            )
        if HAS_L:
            tl.store(
                LOUT + row * CL + rows[:, None] * CL + cl[None, :],
                lacc * r[:, None],
                mask=live[:, None] & (cl < CL)[None, :],
            )


def _width(x: int) -> int:
    """A block width for x columns: a power of two, at least 16 (Triton's smallest product)."""
    return max(16, 1 << max(0, int(x) - 1).bit_length())


def blocks(d: int, device_type: str, fp32: bool, columns: int = 0) -> dict:
    """Launch parameters: query rows and keys per block, warps and pipeline stages, for heads ``d`` wide and
    ``columns`` value or lower columns. Chosen so that the build spills few registers and fits the shared memory
    of an A100 and an H100 (sm_80, sm_90), as compiled without a GPU (benchmarks/triton_compile.py): half
    precision up to 128 wide with at most 16 columns, the flash-attention tutorial's 128 rows, 64 keys, 8 warps, 3
    stages; wider heads, more columns (Clark's word columns: one per word) or float32 inputs (products in full
    float32, on the CUDA cores), 64 x 32. Under the interpreter 64 and 64 (its time grows with the number of
    blocks)."""
    if device_type != "cuda":
        return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 1, "num_stages": 1}
    if not fp32 and d <= 128 and columns <= 16:
        return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}


def attention_pass(q, k, v, keybias, causal: bool, scale: float, cols=None, lcols=None, entropy=False, launch=None):
    """(A.v [B, H, n, dv] in v's dtype, LSE [B, H, n], {"values": A.cols [B, H, n, C], "lower": sum_{j <= i}
    A_ij lcols_j [B, H, n, C'], "entropy": -sum_j A_ij ln A_ij [B, H, n]}, the asked ones; float32) of q [B, H, n,
    d] and k, v [B, Hkv, n, .] (grouped heads not expanded) on a CUDA device or, under Triton's interpreter, a
    CPU. ``keybias``: [B, n] additive (-inf hides a key) or None; ``cols``, ``lcols``: [B, n, C] key columns.
    ``launch``: :func:`blocks`' parameters to use instead (benchmarks)."""
    import torch

    bsz, h, n, d = q.shape
    hk, dv = k.shape[1], v.shape[-1]
    if h % hk:
        raise ValueError(f"{h} query heads over {hk} key heads")
    dev = q.device
    unit = lambda x: x if x.stride(-1) == 1 else x.contiguous()  # noqa: E731 (the kernel steps rows by stride)
    q, k, v = unit(q.detach()), unit(k.detach()), unit(v.detach())
    if max(x.stride(2) for x in (q, k, v)) * n >= 2**31:  # offsets within a sequence's head are 32-bit
        raise ValueError(f"{n} tokens with rows {max(x.stride(2) for x in (q, k, v))} apart: past 32-bit offsets")
    f32 = torch.float32
    out = torch.empty((bsz, h, n, dv), dtype=v.dtype, device=dev)
    lse = torch.empty((bsz, h, n), dtype=f32, device=dev)
    ent = torch.empty((bsz, h, n), dtype=f32, device=dev) if entropy else lse
    if keybias is not None:  # additive (-inf hides) or boolean (False hides)
        keybias = keybias if keybias.dtype == torch.bool else keybias > -math.inf
    keys = None if keybias is None else keybias.to(torch.int8).contiguous()
    x = None if cols is None else cols.detach().to(f32).contiguous()
    lw = None if lcols is None else lcols.detach().to(f32).contiguous()
    xout = None if x is None else torch.empty((bsz, h, n, x.shape[-1]), dtype=f32, device=dev)
    lout = None if lw is None else torch.empty((bsz, h, n, lw.shape[-1]), dtype=f32, device=dev)
    fp32 = q.dtype == f32
    columns = max(0 if x is None else x.shape[-1], 0 if lw is None else lw.shape[-1])
    cfg = dict(blocks(d, dev.type, fp32, columns) if launch is None else launch)
    grid = (-(-n // cfg["BLOCK_M"]), bsz * h)
    attention_pass_kernel[grid](
        q, k, v, lse if keys is None else keys, lse if x is None else x, lse if lw is None else lw,
        out, lse, ent, lse if xout is None else xout, lse if lout is None else lout,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *((0, 0) if x is None else x.stride()[:2]), *((0, 0) if lw is None else lw.stride()[:2]),
        h, h // hk, n, d, dv, 0 if x is None else x.shape[-1], 0 if lw is None else lw.shape[-1], scale * LOG2E,
        BLOCK_D=_width(d), BLOCK_DV=_width(dv), BLOCK_C=_width(0 if x is None else x.shape[-1]),
        BLOCK_CL=_width(0 if lw is None else lw.shape[-1]), CAUSAL=bool(causal), HAS_KEYS=keys is not None,
        ENTROPY=bool(entropy), HAS_X=x is not None, HAS_L=lw is not None, F32_DOTS=interpreted(),
        QK_PRECISION="ieee" if fp32 else "tf32", **cfg,
    )  # fmt: skip
    got = {}
    if xout is not None:
        got["values"] = xout
    if lout is not None:
        got["lower"] = lout
    if entropy:
        got["entropy"] = ent
    return out, lse, got
