"""CPU-seconds of one forward pass along the model ladder, the models side by side in one process (one thread,
interleaved rounds), against their FLOPs: does a bigger model cost what its parameter count says?

Run from the repository root with the project's environment, pointing at models the workflow cached (a run of
``config/scale-quick.yaml`` or ``config/scale-1.5b.yaml`` writes them under ``results/models/gguf/``)::

    PYTHONPATH=scripts python benchmarks/bench_ladder_forward.py \\
        --models qwen05=RUN/results/models/gguf/qwen05,qwen15=RUN_15/results/models/gguf/qwen15 \\
        --out benchmarks/results_ladder_forward.json

Per input shape (batch x tokens; with every position's logits, as the ablations score them, or the last one
only, as the ICL patching does) and model: the fastest of ``--reps`` rounds of CPU-seconds per forward, and the
ratio of each model's time to the first model's beside the ratio of their FLOPs (2 per parameter per token:
the parameters outside the embeddings, plus the output layer for the positions whose logits are kept). The
machine may be shared: the ratios within one process are the comparable numbers.

``--copies K`` asks whether a CPU-second is the same amount of work when jobs run side by side, as a workflow's
jobs do (``snakemake --cores 2`` runs two one-thread jobs at once): the same measurement in one process alone,
then in K processes started together; each copy's GFLOP per CPU-second against the lone one's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

SHAPES = {"4x128 logits": (4, 128, None), "4x128 last": (4, 128, 1), "16x36 logits": (16, 36, None)}


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def flops(cfg: dict, batch: int, n: int, keep: int | None) -> float:
    from headatlas.core.plan import shape_from_config

    s = shape_from_config(cfg)
    kept = batch * (n if keep is None else keep)
    return 2.0 * (s.body_params * batch * n + s.vocab * s.d_model * kept)


def measure(paths: dict[str, str], reps: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    models = {
        name: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32, attn_implementation="sdpa").eval()
        for name, p in paths.items()
    }
    configs = {name: json.loads((Path(p) / "config.json").read_text()) for name, p in paths.items()}
    g = torch.Generator().manual_seed(0)
    times: dict[tuple[str, str], list[float]] = {}
    with torch.no_grad():
        for _ in range(reps):
            for shape, (b, n, keep) in SHAPES.items():
                ids = torch.randint(100, 30000, (b, n), generator=g)
                for name, m in models.items():
                    kw = {} if keep is None else {"logits_to_keep": keep}
                    c0 = cpu_s()
                    m(ids, **kw)
                    times.setdefault((shape, name), []).append(cpu_s() - c0)
    ref = next(iter(models))
    rows = []
    for shape, (b, n, keep) in SHAPES.items():
        for name in models:
            t = min(times[(shape, name)])
            f = flops(configs[name], b, n, keep)
            rows.append({"shape": shape, "model": name, "cpu_s": round(t, 3), "all_cpu_s": times[(shape, name)],
                         "gflop": round(f / 1e9, 1), "gflop_per_cpu_s": round(f / 1e9 / t, 1),
                         "time_ratio": round(t / min(times[(shape, ref)]), 2),
                         "flop_ratio": round(f / flops(configs[ref], b, n, keep), 2)})  # fmt: skip
    return rows


def side_by_side(argv: list[str], copies: int) -> dict:
    """The measurement in one child process alone, then in ``copies`` children started together."""
    cmd = [sys.executable, __file__, *argv, "--child"]
    alone = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    together = [json.loads(p.communicate()[0]) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a copy failed")
    for i, row in enumerate(alone):
        rates = [c[i]["gflop_per_cpu_s"] for c in together]
        print(f"{row['shape']:<14} {row['model']:<8} alone {row['gflop_per_cpu_s']:6.1f} GFLOP/CPU-s, "
              f"{copies} together " + ", ".join(f"{r:.1f}" for r in rates))  # fmt: skip
    return {"copies": copies, "alone": alone, "together": together}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="name=directory,... (the first is the reference)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--copies", type=int, default=1, help="also measure K copies side by side (see above)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    paths = dict(x.split("=", 1) for x in args.models.split(","))
    if args.child:
        print(json.dumps(measure(paths, args.reps)))
        return 0
    if args.copies > 1:
        result = side_by_side(["--models", args.models, "--reps", str(args.reps)], args.copies)
    else:
        rows = measure(paths, args.reps)
        for r in rows:
            print(f"{r['shape']:<14} {r['model']:<8} {r['cpu_s']:7.3f} CPU-s  {r['gflop_per_cpu_s']:6.1f} GFLOP/s  "
                  f"time x{r['time_ratio']}  FLOPs x{r['flop_ratio']}")  # fmt: skip
        result = {"rows": rows}
    if args.out:
        args.out.write_text(json.dumps({"threads": 1, "reps": args.reps, **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
