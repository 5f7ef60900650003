"""The map-free statistics' attention pass per layer: :func:`headatlas.core.mapfree.layer_attention` (the one
path, the same Python on every device) with each of its kernels on a CPU, :func:`headatlas.core.cpu_pass.
attention_pass` (attention_pass.c: the model's output, LSE and the sums over every cell from one pass over the
scores; ``extraction.cpu_pass: auto``) and :func:`headatlas.core.mapfree.blocked_attention` (torch products in row
blocks; ``off``, and the kernel a GPU takes for these sums), against torch's CPU flash kernel with the model's
values only (what the SDPA forward spends).

Run from the repository root with the project's environment (CPU, one thread)::

    PYTHONPATH=scripts python benchmarks/bench_attention_pass.py --out benchmarks/results_attention_pass.json

Per head shape (MiniLM: 12 heads of 32, padded encoder batches; SmolLM2: 9 query heads on 3 key heads of 64,
causal) and length, random q, k, v in the shape of the map-free benchmark's batches (16 x 128, 4 x 512, 1 x 2048,
1 x 8192), every variant once as a warm-up and then ``--reps`` rounds of one repetition each, each variant's
fastest (milliseconds):

- ``model``: the flash kernel with the model's values only (A.V and LSE);
- ``layer_c``: ``layer_attention`` with the C pass (``cpu_pass: auto``) for the position statistics' sums (A.V,
  LSE, the entropy, the position column A.pos and an encoder's two sums over keys j <= i); ``layer_c_targets``
  adds the default reducers' 9 targets per query (``FreeLayer``: the position band -2..2 (a decoder's -2..0) and
  the first key by their fixed forms, 3 detector targets by an index of the keys): what a layer of the default run
  computes;
- ``layer_blocked``, ``layer_blocked_targets``: the same with ``cpu_pass: off`` (the blocked products);
- ``cpu_pass_bare``: the C pass for A.V and LSE alone (``cpu_pass_bare_strided``: on q, k, v stored as a model
  hands them, views of [B, n, H, d] projections, which the map-free feed copies first); ``cpu_pass_entropy`` adds
  the entropy, ``cpu_pass_columns`` the position column (and an encoder's two lower columns), and ``cpu_pass``
  Clark's smoothed entropy (eps 1e-4).

Their equality with an explicit softmax is tested in tests/unit/core/test_mapfree.py (``test_cpu_attention_pass``,
``test_blocked_attention``, ``test_layer_attention``).
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
from headatlas.core.layer_view import key_target, offset_target  # noqa: E402
from headatlas.core.mapfree import FreeLayer, attention_lse, layer_attention  # noqa: E402
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
    """The benchmarks' common arguments: --runs MODEL:LENGTH:BATCH,..., --reps, --cells (the blocked products' row
    blocks; bench_compiled_block.py), --out."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--runs", default=RUNS)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cells", type=int, default=2**20)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def measure(model: str, n: int, bsz: int, reps: int) -> dict:
    import torch

    h, hk, d, _ = SHAPES[model]
    q, k, v, mask, pos, scale, causal = inputs(model, n, bsz)
    lcols = None if causal else torch.cat([torch.ones_like(pos), pos], -1)
    bias = None if mask is None else mask[:, 0, 0]
    low = None if lcols is None else lcols[:, 0]
    ours = lambda *extra: lambda: attention_pass(q, k, v, bias, causal, scale, *extra)  # noqa: E731
    # the same values stored as a model hands them: [B, H, n, d] views of its [B, n, H, d] projections
    qs, ks, vs = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    lengths = [n] * bsz if mask is None else [int(x) for x in torch.isfinite(mask[:, 0, 0]).sum(-1)]
    rows = [{"word": np.arange(m), "special": np.zeros(m, dtype=np.int64), "segment": np.zeros(m, dtype=np.int64),
             "piece": np.full(m, "", dtype=object)} for m in lengths]  # fmt: skip
    batch = ReduceBatch.from_rows(np.arange(bsz), rows, np.arange(bsz), np.array(lengths))
    band = (-2, -1, 0) if causal else (-2, -1, 0, 1, 2)
    targets = {f"offset:{o}": offset_target(batch, o) for o in band} | {"key:0": key_target(batch, 0)}
    targets |= {name: np.random.default_rng(i).integers(-1, n, (bsz, n)) for i, name in enumerate("abc")}

    def layer(c_pass: bool, with_targets: bool):
        def run():
            out, lse, got = layer_attention(q, k, v, mask, causal, scale, pos, lcols, True, c_pass=c_pass)
            if with_targets:
                FreeLayer(q, k, lse, scale, batch, causal, {}, {}, got["entropy"], targets)

        return run

    ran_c, ran = set(), set()
    layer_attention(q, k, v, mask, causal, scale, pos, lcols, True, ran=ran_c, c_pass=True)
    layer_attention(q, k, v, mask, causal, scale, pos, lcols, True, ran=ran)
    variants = {  # the pass's variants add one kind of sum each to the one before
        "model": lambda: attention_lse(q, k, v, mask, causal, scale),
        "layer_c": layer(True, False),
        "layer_c_targets": layer(True, True),
        "layer_blocked": layer(False, False),
        "layer_blocked_targets": layer(False, True),
        "cpu_pass_bare": ours(),
        "cpu_pass_bare_strided": lambda: attention_pass(qs, ks, vs, bias, causal, scale),
        "cpu_pass_entropy": ours(None, None, True),
        "cpu_pass_columns": ours(pos[:, 0], low, True),
        "cpu_pass": ours(pos[:, 0], low, True, 1e-4),
    }
    best = fastest(variants, reps)
    row = {"model_type": model, "tokens": n, "batch": bsz, "heads": h, "key_heads": hk, "head_size": d}
    row |= {f"{name}_ms": round(t * 1e3, 2) for name, t in best.items()}
    row["layer_c_over_model"] = round(best["layer_c"] / best["model"], 3)
    row["layer_c_targets_over_model"] = round(best["layer_c_targets"] / best["model"], 3)
    row["kernels"] = {"layer_c": ",".join(sorted(ran_c)), "layer_blocked": ",".join(sorted(ran))}
    return row


def main(argv=None) -> int:
    import torch

    a = arguments(argv, __doc__.splitlines()[0])
    torch.set_num_threads(1)
    report = {"threads": 1, "torch": torch.__version__}
    rows = []
    for spec in a.runs.split(","):
        model, n, bsz = spec.split(":")
        rows.append(measure(model, int(n), int(bsz), a.reps))
        print(json.dumps(rows[-1]), flush=True)
    report["runs"] = rows
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
