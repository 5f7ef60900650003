"""The one path's blocked products compiled by ``torch.compile`` (inductor: the block's exponentials, sums and
entropy fused into one generated loop; the products stay BLAS calls), against the same products run eagerly
(:func:`headatlas.core.mapfree.blocked_attention`, what ``extraction.cpu_pass: off`` runs) and against the CPU
flash kernel with the model's values only (what the SDPA forward spends on the layer).

Run from the repository root with the project's environment (CPU, one thread; inductor needs a C++ compiler)::

    PYTHONPATH=scripts python benchmarks/bench_compiled_block.py --out benchmarks/results_compiled_block.json

Per head shape and batch of ``bench_attention_pass.py`` (MiniLM: 12 heads of 32, padded encoder batches;
SmolLM2: 9 query heads on 3 key heads of 64, causal), random q, k, v; every variant computes the layer's A.V, LSE,
row entropy and one value column (the position), in row blocks of about ``--cells`` cells:

- ``model``: the flash kernel, A.V and LSE alone;
- ``blocked``: ``blocked_attention`` (eager torch);
- ``compiled``: :func:`block` below, the same per-block arithmetic as ``blocked_attention`` written as one
  function of a block's tensors, compiled once with ``dynamic=True`` (the block's row and key counts vary);
  ``compile_s``: its first call's time, the compile, once per process (inductor's cache on disk shortens later
  processes' compiles).

Each variant once as a warm-up, then ``--reps`` interleaved rounds, each variant's fastest (milliseconds); the
compiled outputs' largest difference from ``blocked``'s is reported (``max_diff``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from headatlas.core.mapfree import LN2, LOG2E, attention_lse, blocked_attention  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_attention_pass import SHAPES, arguments, fastest, inputs  # noqa: E402


def block(qb, kt, vf, ct, bias):
    """One block of rows, as in ``blocked_attention``: qb [G, R, d] (scaled by scale log2 e), kt [G, d, t], vf
    [G, t, dv], ct [G, C, t], bias [G or 1, R or 1, t] (log2 units, finite) -> A.v, LSE, entropy, A.cols^T."""
    import torch

    s = torch.baddbmm(bias, qb, kt)
    mx = s.amax(-1, keepdim=True)
    s = s - mx
    e = torch.exp2(s)
    z = e.sum(-1, keepdim=True)
    r = 1.0 / z
    lz = z[..., 0].log2()
    out = torch.bmm(e, vf) * r
    lse = (mx[..., 0] + lz) * LN2
    ent = (lz - (e * s).sum(-1) * r[..., 0]) * LN2
    val = torch.bmm(ct, e.transpose(1, 2)) * r.transpose(1, 2)
    return out, lse, ent, val


def blocks(fn, q, k, v, cols, mask, causal: bool, scale: float, cells: int):
    """The layer through ``fn`` block by block (the block sizes of ``blocked_attention``, key columns per key
    head)."""
    import torch

    bsz, h, n, d = q.shape
    hk, g = k.shape[1], h // k.shape[1]
    qs = (q * (scale * LOG2E)).reshape(bsz * hk, g, n, d)
    kt = k.reshape(bsz * hk, n, d).transpose(1, 2)
    vf = v.reshape(bsz * hk, n, -1)
    ct = cols[:, 0].transpose(1, 2).repeat_interleave(hk, 0)  # [B * Hkv, C, n]
    key = torch.zeros(bsz, 1, n) if mask is None else (mask[:, 0] * LOG2E).clamp(min=-1e30)
    key = key.repeat_interleave(hk, 0)  # [B * Hkv, 1, n]
    per_row = max(1.0, cells / (bsz * h))
    lo, parts = 0, []
    while lo < n:
        m = int((math.sqrt(lo * lo + 4 * per_row) - lo) / 2) if causal else int(per_row // n)
        m = max(1, min(n - lo, m))
        hi = lo + m
        t = hi if causal else n
        bias = key[..., :t]
        if causal:  # the block's own square: later keys hidden
            tri = torch.zeros(m, t)
            tri[:, lo:] = torch.full((m, m), -1e30).triu_(1)
            bias = (bias + tri.repeat(g, 1)).contiguous()
        qb = qs[:, :, lo:hi].reshape(bsz * hk, g * m, d)
        parts.append(fn(qb, kt[..., :t], vf[:, :t], ct[..., :t], bias))
        lo = hi
    return parts


def measure(model: str, n: int, bsz: int, reps: int, cells: int, compiled) -> dict:
    import torch

    h, hk, d, _ = SHAPES[model]
    q, k, v, mask, pos, scale, causal = inputs(model, n, bsz)
    t0 = time.perf_counter()
    mine = blocks(compiled, q, k, v, pos, mask, causal, scale, cells)
    compile_s = time.perf_counter() - t0
    ref = blocked_attention(q, k, v, mask, causal, scale, pos, None, True, False, cells)
    g = h // hk  # the compiled blocks' entropy and column in blocked_attention's [B, H, n] order
    ents = torch.cat([p[2].reshape(bsz * hk, g, -1) for p in mine], 2).reshape(bsz, h, n)
    vals = torch.cat([p[3].reshape(bsz * hk, 1, g, -1) for p in mine], 3).reshape(bsz, h, n)
    diff = max(float((ents - ref[2]["entropy"]).abs().max()), float((vals - ref[2]["values"][..., 0]).abs().max()))
    variants = {
        "model": lambda: attention_lse(q, k, v, mask, causal, scale),
        "blocked": lambda: blocked_attention(q, k, v, mask, causal, scale, pos, None, True, False, cells),
        "compiled": lambda: blocks(compiled, q, k, v, pos, mask, causal, scale, cells),
    }
    best = fastest(variants, reps)
    row = {"model_type": model, "tokens": n, "batch": bsz, "heads": h, "key_heads": hk, "head_size": d}
    row |= {f"{name}_ms": round(t * 1e3, 2) for name, t in best.items()}
    row |= {"compile_s": round(compile_s, 2), "max_diff": diff}
    row["compiled_over_blocked"] = round(best["compiled"] / best["blocked"], 3)
    row["compiled_over_model"] = round(best["compiled"] / best["model"], 3)
    return row


def main(argv=None) -> int:
    import torch

    a = arguments(argv, __doc__.splitlines()[0])
    torch.set_num_threads(1)
    compiled = torch.compile(block, dynamic=True)
    report = {"cells": a.cells, "threads": 1, "torch": torch.__version__, "runs": []}
    for spec in a.runs.split(","):
        model, n, bsz = spec.split(":")
        report["runs"].append(measure(model, int(n), int(bsz), a.reps, a.cells, compiled))
        print(json.dumps(report["runs"][-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
