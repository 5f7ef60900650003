"""Candidate design for the map-free statistics' extra passes: the layer's attention computed in row blocks with
torch products (``blocked_attention`` below), against the widened flash-kernel call the map-free path makes
today (:func:`headatlas.core.mapfree.wide_pass`, q and k padded to the value width [V | K | columns]).

Run from the repository root with the project's environment (CPU, one thread)::

    PYTHONPATH=scripts python benchmarks/bench_blocked.py --out benchmarks/results_blocked.json

Per head shape (MiniLM: 12 heads of 32, padded encoder batches; SmolLM2: 9 query heads on 3 key heads of 64,
causal) and length, random q, k, v in the shape of the map-free benchmark's batches (16 x 128, 4 x 512, 1 x 2048,
1 x 8192), every variant once as a warm-up and then ``--reps`` times, fastest repetition:

- ``model``: the flash kernel with the model's values only (what a layer with targets only costs);
- ``wide``: the call the map-free path makes for the position statistics: values [V | K | pos | lower columns];
- ``blocked``: ``blocked_attention`` for the same outputs (A.V, LSE, A.pos, the entropy, an encoder's sums over
  keys j <= i), row blocks of about ``--cells`` cells.

``--check`` first compares ``blocked_attention`` with an explicit softmax on small shapes (grouped heads, padding,
causal with and without a mask, block sizes that do not divide the length). Not used by the workflow: the
measurements in benchmarks/README.md ("Map-free extraction: blocked attention") decide whether it replaces the
widened call.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from headatlas.core.mapfree import LOG2E, attention_lse, wide_pass  # noqa: E402
from headatlas.core.reducer import scratch  # noqa: E402

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
    cells: int = 2**20,
):
    """The layer's attention and its statistics' passes in row blocks of at most about ``cells`` cells, from q
    [B, H, n, d] and k, v [B, Hkv, n, .] (grouped heads not expanded): per block of query rows one product
    s = scale q.k (as log2(e) s), the row max, 2^(s - max), their sum z, one product of those with v
    and one with the key columns, so the scores and exponentials are computed once for the model's output and
    every column.
    Returns (A.v [B, H, n, dv] in v's dtype, LSE [B, H, n], {"values": A.cols [B, H, n, C], "lower": sum_{j <= i}
    A_ij lcols_j [B, H, n, C'], "entropy": -sum_j A_ij ln A_ij [B, H, n]}, only the asked ones); ``cols``,
    ``lcols``: [B, 1, n, C] key columns (the same for every head). ``mask``: additive float or None, ``causal``
    only with ``mask`` None (as :func:`attention_lse`); ``later_masked``: the mask hides every key after the
    query (a decoder's padded batch), so a block stops at its last row's key. Never more than a block of cells
    is held (two reused buffers). On the CPU this costs less than widening the flash kernel's call to the
    columns, whose value width must equal the query's (measured: benchmarks/README.md)."""
    import torch

    bsz, h, n, d = q.shape
    hk, dv = k.shape[1], v.shape[-1]
    g = h // hk
    dev = q.device
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
            mask = mask.reshape(bsz, hk if per_head else 1, g if per_head else 1, *mask.shape[2:])
    out = torch.empty((bsz * hk, g, n, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((bsz * hk, g, n), dtype=torch.float32, device=dev)
    ent = torch.empty((bsz * hk, g, n), dtype=torch.float32, device=dev) if entropy else None
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
        elif causal:
            s5[..., lo:hi].add_(torch.full((m, m), -1e30, device=dev).triu_(1))
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
    return out.view(bsz, h, n, dv).to(v.dtype), lse.view(bsz, h, n), got


def reference(q, k, v, add, scale, cols, lcols):
    """The same outputs from an explicit softmax (grouped heads expanded)."""
    import torch

    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale + add
    a = torch.softmax(s, -1)
    n = q.shape[2]
    low = (a * torch.ones(n, n).tril()) @ lcols
    return a @ v.repeat_interleave(g, 1), torch.logsumexp(s, -1), a @ cols, low, torch.special.entr(a).sum(-1)


def check() -> float:
    """Max abs difference blocked vs explicit softmax over real query rows (raises above 2e-5)."""
    import torch

    worst = 0.0
    for bsz, h, hk, n, d, causal, cells in [
        (2, 6, 2, 9, 8, False, 50), (2, 6, 2, 9, 8, True, 50), (3, 4, 4, 33, 16, False, 10**9),
        (3, 4, 2, 33, 16, True, 200), (1, 2, 1, 1, 4, True, 10),
    ]:  # fmt: skip
        torch.manual_seed(0)
        scale = 0.3
        q, k, v = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2, torch.randn(bsz, hk, n, d)
        lengths = torch.tensor([n] + [max(1, n - 3)] * (bsz - 1))
        key_ok = torch.arange(n)[None] < lengths[:, None]
        allowed = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
        add = torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
        cols, lcols = torch.randn(bsz, 1, n, 3), torch.randn(bsz, 1, n, 2)
        want = reference(q, k, v, add, scale, cols, lcols)
        forms = [(add, False, causal)] + ([(None, True, False)] if causal else [])  # 4-D mask; the causal flag
        for mask, flag, later in forms:
            out, lse, got = blocked_attention(q, k, v, mask, flag, scale, cols, lcols, True, later, cells)
            rows = slice(None) if mask is not None else slice(0, 1)  # the flag alone: the unpadded sequence
            real = key_ok[rows, None, :]
            for x, y in zip((out, lse, got["values"], got["lower"], got["entropy"]), want):
                x, y = x[rows], y[rows]
                r = real[..., None] if x.dim() == 4 else real
                err = float((torch.where(r, x, 0.0) - torch.where(r, y, 0.0)).abs().max())
                worst = max(worst, err)
    if worst > 2e-5:
        raise AssertionError(f"blocked_attention differs from the explicit softmax by {worst:.2e}")
    return worst


SHAPES = {  # name -> (batch, query heads, key heads, head size, causal), with the map-free benchmark's batches
    "minilm": (12, 12, 32, False),
    "smollm2": (9, 3, 64, True),
}


def bench(fn, reps: int) -> float:
    fn()
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(model: str, n: int, bsz: int, reps: int, cells: int) -> dict:
    import torch

    h, hk, d, causal = SHAPES[model]
    torch.manual_seed(0)
    q, k, v = torch.randn(bsz, h, n, d), torch.randn(bsz, hk, n, d), torch.randn(bsz, hk, n, d)
    scale = d**-0.5
    mask = None
    if not causal:  # padded encoder batch: the first sequence full, the others between n / 2 and n
        lengths = torch.randint(n // 2, n + 1, (bsz,))
        lengths[0] = n
        mask = torch.zeros(bsz, 1, 1, n).masked_fill_(torch.arange(n) >= lengths[:, None, None, None], -math.inf)
    pos = torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(bsz, 1, n, 1)
    lcols = None if causal else torch.cat([torch.ones_like(pos), pos], -1)
    # the widened call: K, the position column and (encoder) 3 key blocks of the lower columns
    extra = [k, pos.expand(bsz, hk, n, 1)] + ([] if causal else [lcols.repeat(1, 1, 1, 3).expand(bsz, hk, n, 6)])
    wide_v = torch.cat([v] + extra, -1)
    times = {
        "model": bench(lambda: attention_lse(q, k, v, mask, causal, scale), reps),
        "wide": bench(lambda: wide_pass(q, k, wide_v, mask, causal, scale), reps),
        "blocked": bench(lambda: blocked_attention(q, k, v, mask, causal, scale, pos, lcols, True, False, cells), reps),
    }
    row = {"model_type": model, "tokens": n, "batch": bsz, "heads": h, "key_heads": hk, "head_size": d}
    row |= {f"{name}_ms": round(t * 1e3, 2) for name, t in times.items()}
    row["blocked_over_wide"] = round(times["blocked"] / times["wide"], 3)
    row["extra_blocked_over_extra_wide"] = round(
        (times["blocked"] - times["model"]) / (times["wide"] - times["model"]), 3
    )
    return row


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--runs", default="minilm:128:16,minilm:512:4,smollm2:128:16,smollm2:512:4,smollm2:2048:1,smollm2:8192:1"
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cells", type=int, default=2**20)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    report = {"cells": a.cells, "threads": 1, "torch": torch.__version__}
    if a.check:
        report["check_max_abs_diff"] = check()
        print(f"check: max abs difference {report['check_max_abs_diff']:.2e}", flush=True)
    rows = []
    for spec in a.runs.split(","):
        model, n, bsz = spec.split(":")
        rows.append(measure(model, int(n), int(bsz), a.reps, a.cells))
        print(json.dumps(rows[-1]), flush=True)
    report["runs"] = rows
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
