"""Benchmark the batched per-head probes (Jo & Myaeng) against a one-head-at-a-time loop.

Run from the repository root with the project's environment, after the workflow has
extracted the probing corpus for MiniLM (or with ``--synthetic``)::

    . .venv/bin/activate
    python benchmarks/bench_probes.py --threads 2                       # real MiniLM vectors
    python benchmarks/bench_probes.py --synthetic --threads 2           # no workflow run needed

Real data: the head vectors of ``--store`` (default ``results/attention/minilm/probing/shard0of1``)
for the items of ``--table`` (default ``results/probing/tasks.tsv.gz``). Synthetic data: the
same shapes as the default MiniLM run (6 layers x 12 heads, head size 32; 1000/250/250 items
per task; each task's number of classes), Gaussian vectors with a label signal of random
strength per head.

For every probing task it times, with torch pinned to ``--threads`` threads:

1. ``batched``: the probes of all heads at once (``train_probes``, the L2 grid batched too);
2. ``kernel loop``: the same code one head at a time (``train_probes_loop``), checking that
   the dev/test accuracies are identical;
3. ``senteval loop``: the reference code's per-head loop (``senteval_loop``: SentEval's
   classifier, ``nn.Linear`` + autograd + ``torch.optim``, one head and one L2 value at a
   time), checking that the accuracies agree;
4. ``task``: everything the ``jomyaeng_probe`` rule computes for the task (per-head probes,
   per-head control probes, layer probes, the top-n curve), with ``--n-curve``.

It prints a Markdown table and writes JSON to ``--json`` (default
``benchmarks/results_probes.json``). ``--loop-tasks K`` times the kernel loop on the first K
tasks (default all) and ``--senteval-tasks K`` the much slower SentEval loop on the first K
(default 2); each speed-up is measured on the tasks it was timed on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from headatlas.jomyaeng.analysis import TopNSettings, probe_task, task_data, task_features  # noqa: E402
from headatlas.jomyaeng.probes import SPLITS, ProbeConfig, senteval_loop, train_probes, train_probes_loop  # noqa: E402
from headatlas.jomyaeng.probing_tasks import PROBING_TASKS, read_table  # noqa: E402

CLASSES = {"SentLen": 6, "WordContent": 30, "TreeDepth": 8, "TopConstituents": 10}


def synthetic(task: str, seed: int, L=6, H=12, d=32, sizes=(1000, 250, 250)):
    rng = np.random.default_rng(seed)
    C = CLASSES.get(task, 2)
    N = sum(sizes)
    split = np.repeat(np.array(SPLITS), sizes)
    y = rng.integers(0, C, N)
    heads = rng.normal(size=(L, H, N, d)).astype(np.float32)
    strength = rng.uniform(0, 1.5, size=(L, H))
    heads[:, :, np.arange(N), y % d] += strength[:, :, None]
    layers = rng.normal(size=(L, N, 12 * d)).astype(np.float32)
    import pandas as pd

    items = pd.DataFrame(
        {
            "split": split,
            "record": np.arange(N).astype(str),
            "label": y.astype(str),
            "control": rng.integers(0, C, N).astype(str),
        }
    )
    return heads, layers, task_data(items, list(items["record"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", default="results/attention/minilm/probing/shard0of1")
    ap.add_argument("--table", default="results/probing/tasks.tsv.gz")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loop-tasks", type=int, default=len(PROBING_TASKS))
    ap.add_argument("--senteval-tasks", type=int, default=2)
    ap.add_argument("--n-curve", type=int, nargs="*", default=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48])
    ap.add_argument("--json", default="benchmarks/results_probes.json")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    cfg = ProbeConfig()
    data_source = "synthetic"
    if not args.synthetic:
        from headatlas.core.store import AttentionStore

        if not Path(args.store).is_dir() or not Path(args.table).is_file():
            sys.exit(f"{args.store} or {args.table} missing: run the workflow first, or pass --synthetic")
        table = read_table(args.table)
        store = AttentionStore(args.store)
        data_source = f"{args.store} ({store.meta['model']})"

    rows = []
    for k, task in enumerate(PROBING_TASKS):
        if args.synthetic:
            heads, layers, data = synthetic(task, k)
        else:
            data = task_data(table[table["task"] == task], list(store.record_id))
            heads, layers = task_features(store, data)
        L, H, N, d = heads.shape
        flat = heads.reshape(L * H, N, d)
        X = {s: flat[:, data.mask(s)] for s in SPLITS}
        y = {s: data.y[data.mask(s)] for s in SPLITS}
        C = len(data.classes)
        t = time.perf_counter()
        batched = train_probes(X, y, cfg, C)
        t_batched = time.perf_counter() - t
        row = {
            "task": task,
            "heads": L * H,
            "n_train": int(data.mask("train").sum()),
            "classes": C,
            "batched_s": t_batched,
        }
        if k < args.loop_tasks:
            t = time.perf_counter()
            loop = train_probes_loop(X, y, cfg, C)
            row["loop_s"] = time.perf_counter() - t
            row["identical"] = bool(
                np.array_equal(batched.dev_grid, loop.dev_grid) and np.array_equal(batched.test_grid, loop.test_grid)
            )
        if k < args.senteval_tasks:
            t = time.perf_counter()
            ref = senteval_loop(X, y, cfg, C)
            row["senteval_s"] = time.perf_counter() - t
            row["senteval_max_diff"] = float(np.abs(ref.test_grid - batched.test_grid).max())
            row["senteval_same_test"] = float((ref.test == batched.test).mean())
        t = time.perf_counter()
        probe_task(heads, layers, data, cfg, TopNSettings(n_curve=tuple(args.n_curve)), task=task)
        row["task_s"] = time.perf_counter() - t
        row["best_head_test"] = float(batched.test[int(np.argmax(batched.dev))])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    looped = [r for r in rows if "loop_s" in r]
    ref = [r for r in rows if "senteval_s" in r]
    total = {
        "batched_s": sum(r["batched_s"] for r in rows),
        "task_s": sum(r["task_s"] for r in rows),
        "batched_s_on_looped_tasks": sum(r["batched_s"] for r in looped),
        "loop_s_on_looped_tasks": sum(r["loop_s"] for r in looped),
        "batched_s_on_senteval_tasks": sum(r["batched_s"] for r in ref),
        "senteval_s_on_senteval_tasks": sum(r["senteval_s"] for r in ref),
    }
    total["speedup_vs_kernel_loop"] = total["loop_s_on_looped_tasks"] / max(total["batched_s_on_looped_tasks"], 1e-9)
    total["speedup_vs_senteval_loop"] = total["senteval_s_on_senteval_tasks"] / max(
        total["batched_s_on_senteval_tasks"], 1e-9
    )
    out = {
        "data": data_source,
        "threads": args.threads,
        "probe": cfg.__dict__ | {"l2": list(cfg.l2)},
        "n_curve": args.n_curve,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "torch": torch.__version__,
        },
        "tasks": rows,
        "total": total,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")

    print(f"data: {data_source}; torch threads: {args.threads}; load average {os.getloadavg()[0]:.1f}\n")
    print(
        "| task | heads | train | classes | batched (s) | kernel one head at a time (s) | SentEval loop (s) | whole task (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        loop = f"{r['loop_s']:.1f} ({r['loop_s'] / r['batched_s']:.1f}x)" if "loop_s" in r else "-"
        ref_s = f"{r['senteval_s']:.1f} ({r['senteval_s'] / r['batched_s']:.1f}x)" if "senteval_s" in r else "-"
        print(
            f"| {r['task']} | {r['heads']} | {r['n_train']} | {r['classes']} | {r['batched_s']:.1f} | {loop} | {ref_s} | {r['task_s']:.1f} |"
        )
    print(
        f"| **all** | | | | {total['batched_s']:.1f} | {total['loop_s_on_looped_tasks']:.1f} ({total['speedup_vs_kernel_loop']:.1f}x) | "
        f"{total['senteval_s_on_senteval_tasks']:.1f} ({total['speedup_vs_senteval_loop']:.1f}x) | {total['task_s']:.1f} |"
    )
    if looped:
        print(f"identical to one head at a time: {all(r['identical'] for r in looped)}")
    if ref:
        print(
            f"same test accuracy as the SentEval loop for {100 * np.mean([r['senteval_same_test'] for r in ref]):.1f}% of heads "
            f"(largest difference over the L2 grid {max(r['senteval_max_diff'] for r in ref):.4f})"
        )


if __name__ == "__main__":
    main()
