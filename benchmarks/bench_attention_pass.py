"""The map-free statistics' attention pass: :func:`headatlas.core.cpu_pass.attention_pass` (attention_pass.c:
the model's output, LSE and every statistic's sums from one pass over the scores) against torch's CPU flash
kernel with the model's values only (what the SDPA forward spends), against :func:`headatlas.core.mapfree.
layer_attention` (the one path of every device: its widened values go to the blocked products, as
``core.mapfree.kernel_order`` chose by measurement) and against :func:`headatlas.core.mapfree.blocked_attention`
(the same sums from torch products in row blocks).

Run from the repository root with the project's environment (CPU, one thread)::

    PYTHONPATH=scripts python benchmarks/bench_attention_pass.py --out benchmarks/results_attention_pass.json

Per head shape (MiniLM: 12 heads of 32, padded encoder batches; SmolLM2: 9 query heads on 3 key heads of 64,
causal) and length, random q, k, v in the shape of the map-free benchmark's batches (16 x 128, 4 x 512, 1 x 2048,
1 x 8192), every variant once as a warm-up and then ``--reps`` rounds of one repetition each, each variant's
fastest (milliseconds):

- ``model``: the flash kernel with the model's values only (A.V and LSE);
- ``layer``: ``layer_attention`` (``extraction.cpu_pass: off``) for the same outputs as ``blocked``, and
  ``layer_targets`` with the 9 targets of ``cpu_pass_targets`` added (``FreeLayer.at``, one dot product each);
- ``blocked``: ``blocked_attention`` for the position statistics' outputs (A.V, LSE, A.pos, the entropy, an
  encoder's sums over keys j <= i), row blocks of about ``--cells`` cells;
- ``cpu_pass_bare``: the CPU attention pass for A.V and LSE alone; ``cpu_pass_entropy`` adds the entropy,
  ``cpu_pass_targets`` 9 targets per query (the default reducers': the position band and sink, the detectors'
  5), ``cpu_pass_columns`` the position column (and an encoder's two lower columns), and ``cpu_pass`` Clark's
  smoothed entropy (eps 1e-4): every statistic.

Their equality with an explicit softmax is tested in tests/unit/core/test_mapfree.py (``test_cpu_attention_pass``,
``test_blocked_attention``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from headatlas.core.cpu_pass import attention_pass  # noqa: E402
from headatlas.core.mapfree import FreeLayer, attention_lse, blocked_attention, layer_attention  # noqa: E402
from headatlas.core.reducer import ReduceBatch  # noqa: E402

SHAPES = {  # name -> (batch, query heads, key heads, head size, causal), with the map-free benchmark's batches
    "minilm": (12, 12, 32, False),
    "smollm2": (9, 3, 64, True),
}


RUNS = "minilm:128:16,minilm:512:4,minilm:2048:1,smollm2:128:16,smollm2:512:4,smollm2:2048:1,smollm2:8192:1"


def inputs(model: str, n: int, bsz: int):
    """Random q, k, v of the head shape, the additive key mask (a padded encoder batch; None for a decoder), the
    position column [B, 1, n, 1], the scale and the causal flag."""
    import torch

    h, hk, d, causal = SHAPES[model]
    torch.manual_seed(0)
    q, k, v = torch.randn(bsz, h, n, d), torch.randn(bsz, hk, n, d), torch.randn(bsz, hk, n, d)
    mask = None
    if not causal:  # padded encoder batch: the first sequence full, the others between n / 2 and n
        lengths = torch.randint(n // 2, n + 1, (bsz,))
        lengths[0] = n
        mask = torch.zeros(bsz, 1, 1, n).masked_fill_(torch.arange(n) >= lengths[:, None, None, None], -math.inf)
    pos = torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(bsz, 1, n, 1)
    return q, k, v, mask, pos, d**-0.5, causal


def fastest(variants: dict, reps: int) -> dict:
    """Each variant once as a warm-up, then ``reps`` interleaved rounds (one repetition of each variant per round):
    each variant's fastest, in seconds."""
    best = dict.fromkeys(variants, math.inf)
    for fn in variants.values():
        fn()
    for _ in range(reps):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def arguments(argv, description: str):
    """The benchmarks' common arguments: --runs MODEL:LENGTH:BATCH,..., --reps, --cells, --out."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--runs", default=RUNS)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cells", type=int, default=2**20)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def measure(model: str, n: int, bsz: int, reps: int, cells: int) -> dict:
    import torch

    h, hk, d, _ = SHAPES[model]
    q, k, v, mask, pos, scale, causal = inputs(model, n, bsz)
    lcols = None if causal else torch.cat([torch.ones_like(pos), pos], -1)
    bias = None if mask is None else mask[:, 0, 0]
    targets = torch.randint(0, n, (bsz, 9, n), dtype=torch.int32)
    low = None if lcols is None else lcols[:, 0]
    ours = lambda *extra: lambda: attention_pass(q, k, v, bias, causal, scale, *extra)  # noqa: E731
    lengths = [n] * bsz if mask is None else [int(x) for x in torch.isfinite(mask[:, 0, 0]).sum(-1)]
    rows = [{"word": np.arange(m), "special": np.zeros(m, dtype=np.int64), "segment": np.zeros(m, dtype=np.int64),
             "piece": np.full(m, "", dtype=object)} for m in lengths]  # fmt: skip
    batch = ReduceBatch.from_rows(np.arange(bsz), rows, np.arange(bsz), np.array(lengths))
    layer = lambda: layer_attention(q, k, v, mask, causal, scale, pos, lcols, True)  # noqa: E731

    def layer_targets():
        out, lse, got = layer()
        FreeLayer(q, k, lse, scale, batch, causal, {}, {}, got["entropy"]).at(targets.numpy())

    ran = set()
    layer_attention(q, k, v, mask, causal, scale, pos, lcols, True, ran=ran)
    variants = {  # the pass's variants add one kind of sum each to the one before
        "model": lambda: attention_lse(q, k, v, mask, causal, scale),
        "layer": layer,
        "layer_targets": layer_targets,
        "blocked": lambda: blocked_attention(q, k, v, mask, causal, scale, pos, lcols, True, False, cells),
        "cpu_pass_bare": ours(),
        "cpu_pass_entropy": ours(None, None, True),
        "cpu_pass_targets": ours(None, None, True, targets),
        "cpu_pass_columns": ours(pos[:, 0], low, True, targets),
        "cpu_pass": ours(pos[:, 0], low, True, targets, 1e-4),
    }
    best = fastest(variants, reps)
    row = {"model_type": model, "tokens": n, "batch": bsz, "heads": h, "key_heads": hk, "head_size": d}
    row |= {f"{name}_ms": round(t * 1e3, 2) for name, t in best.items()}
    row["cpu_pass_over_model"] = round(best["cpu_pass"] / best["model"], 3)
    row["layer_kernel"] = ",".join(sorted(ran))
    for name in ("layer", "layer_targets", "blocked"):
        row[f"{name}_over_cpu_pass_columns"] = round(best[name] / best["cpu_pass_columns"], 3)
    return row


def main(argv=None) -> int:
    import torch

    a = arguments(argv, __doc__.splitlines()[0])
    torch.set_num_threads(1)
    report = {"cells": a.cells, "threads": 1, "torch": torch.__version__}
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
