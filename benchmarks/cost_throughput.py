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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR:CONFIGFILE[:SNAKEFILE]")
    ap.add_argument("--out", help="write the rates as JSON")
    args = ap.parse_args(argv)
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
