"""Benchmark single-head ablation: batched exact ablation of every head and the estimators against it.

Run from the repository root with the project's environment, after the models exist (rules
cache_model and finetune_model; the wiki corpus from rule prepare_corpus)::

    . .venv/bin/activate
    snakemake --cores 2 results/models/gguf/smollm2 results/models/finetuned/minilm-sst2 results/corpora/wiki.jsonl.gz
    python benchmarks/bench_ablation.py                          # both default models, config/config.yaml
    python benchmarks/bench_ablation.py --models minilm-sst2     # one

For each model and task it measures, with the settings of ``analysis.ablation`` in ``--config``
(one torch thread, as the rules run), CPU seconds of the process (the machine may be shared:
wall times are given too but mean little then):

1. one intact pass over the evaluation set (the unit of cost: "passes");
2. exact ablation of every head, batched with the batch expanded inside the model (layers before
   a head run once) and, on a sample of heads, with replicated inputs (every layer for every head);
3. the estimators (attribution patching ``atp``; integrated gradients along each layer's path ``ig``
   with 1, 2 and 4 steps; AtP* with GradDrop ``atpstar``):
   Spearman rho and top-10 overlap (largest |effect|) with the exact loss effects over all heads,
   the largest and mean absolute error, the cost in passes (forward + backward), and how many
   layers fail the per-layer check (``check_heads`` seeded heads per layer, as the rule does);
   and the same agreement for what the atlas shows when the estimator is used (``checked``): exact
   values for the checked heads and for every head of a failing layer (``on_check_fail: exact``),
   the checked estimates elsewhere;
4. the share of heads removable in the ablation order (exact effects) within the tolerance.

``--exact-from results/ablation`` takes the exact values from the files of rule ablation_exact
(``<dir>/<model>/exact/*.npz``, the same values) instead of ablating again, and skips steps 2 and 4;
``--methods atp atpstar`` measures only those estimators.

Results go to stdout as Markdown and to ``--json`` (default ``benchmarks/results_ablation.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import headatlas  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "scripts"))

METHODS = {  # name: (estimator, steps); the cost in passes (forward, backward) is ``passes``
    "atp": ("atp", 1),
    "ig1": ("ig", 1),
    "ig2": ("ig", 2),
    "ig4": ("ig", 4),
    "atpstar": ("atpstar", 1),
}


def nominal_passes(method: str, steps: int, L: int) -> tuple[float, float]:
    """Nominal (forward, backward) full passes. ig, per step: a block per layer, one per pass where the rows
    allow only one (SmolLM2), each forward a full pass, each backward from the last layer to the block's."""
    return {"atp": (1, 1), "atpstar": (1, L + 1), "ig": (steps * L, steps * (L + 1) / 2)}[method]


CACHE = {"smollm2": "results/models/gguf/smollm2", "minilm-sst2": "results/models/finetuned/minilm-sst2"}


def exact_files(directory: Path, jobs: int, wait_s: float) -> list[Path]:
    """Rule ablation_exact's ``jobs`` files of one model (waiting up to ``wait_s`` for its jobs to write them)."""
    deadline = time.time() + wait_s
    while True:
        files = [directory / f"{k}.npz" for k in range(jobs)]
        if all(f.with_name(f.name + ".sha256").exists() for f in files) or time.time() > deadline:
            return files
        time.sleep(10)


class Clock:
    def __enter__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(CACHE), choices=list(CACHE))
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--results", default=str(REPO / "results"), help="where the models and the corpus are")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--replicated-sample", type=int, default=24, help="heads timed with replicated inputs")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results_ablation.json"))
    ap.add_argument("--exact-from", help="directory of rule ablation_exact's files (<dir>/<model>/exact/*.npz)")
    ap.add_argument("--wait-s", type=float, default=0, help="wait this long for --exact-from's files (beside a run)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    import yaml
    from bench_ablation_check import checked_view  # beside this file

    from headatlas.ablation.analysis import (
        AblationSettings,
        agreement,
        exact_everywhere,
        mean_ci,
        metrics_of,
        pruning_orders,
        read_exact_parts,
        removable_table,
        specialisation,
    )
    from headatlas.ablation.patch import layer_samples
    from headatlas.ablation.tasks import evaluations
    from headatlas.core.bootstrap import resample_counts
    from headatlas.core.data import load_records
    from headatlas.core.models import ModelSpec

    torch.set_num_threads(args.threads)
    config = yaml.safe_load(Path(args.config).read_text())
    section = config["analysis"]["ablation"]
    settings = AblationSettings.pick(section)
    models = {m["name"]: m for m in config["models"]}
    results = {}
    load_start = os.getloadavg()
    res = Path(args.results)
    records = load_records(res / "corpora" / f"{section.get('corpus', 'wiki')}.jsonl.gz")
    for name in args.models:
        spec = ModelSpec.from_config(models[name])
        ft = models[name]["source"].get("finetuned")
        task = dict(config["finetune_tasks"][ft["task"]], name=ft["task"]) if ft else None
        cache = str(res / Path(CACHE[name]).relative_to("results"))
        evals, _ = evaluations(spec, cache, records, task, settings)
        for tname, (ev, _) in evals.items():
            if ev is None:
                continue
            L, H, S = ev.n_layers, ev.n_heads, ev.n_sequences
            N = L * H
            out = {"layers_heads": [L, H], "sequences": S, "mode": settings.mode,
                   "exact_everywhere_by_default": exact_everywhere(ev, settings)}  # fmt: skip
            values = ev.replacement(settings.mode, settings.seed)
            intact = ev.run()
            passes = []
            for _ in range(2):
                with Clock() as c:
                    ev.run()
                passes.append(c.cpu)
            unit = min(passes)
            out["pass_cpu_s"] = unit
            estimates = {}
            for key in args.methods:  # before the exact values, which --exact-from may still be waiting for
                method, steps = METHODS[key]
                with Clock() as c:
                    estimates[key] = (ev.estimate(values, method, steps, settings.exact_max_rows), c)
            if args.exact_from:
                parts = read_exact_parts(
                    exact_files(Path(args.exact_from) / name / "exact", section.get("exact_jobs", 2), args.wait_s)
                )[tname]
                exact = {k: np.zeros((S, N)) for k in parts[0] if k != "heads"}
                for p in parts:
                    for k in exact:
                        exact[k][:, p["heads"]] = p[k]
                assert sorted(np.concatenate([p["heads"] for p in parts])) == list(range(N))
            else:
                with Clock() as c:
                    exact = ev.exact(range(N), values, settings.exact_max_rows)
                out["exact_all_cpu_s"], out["exact_all_wall_s"] = c.cpu, c.wall
                out["exact_all_passes"] = c.cpu / unit
                sample = np.linspace(0, N - 1, min(args.replicated_sample, N)).round().astype(int)
                ev.expand = False
                with Clock() as c:
                    ev.exact(sample, values, settings.exact_max_rows)
                ev.expand = True
                out["replicated_cpu_s_per_head"] = c.cpu / len(sample)
                out["expanded_cpu_s_per_head"] = out["exact_all_cpu_s"] / N
            counts = resample_counts(np.random.default_rng(settings.seed), S, settings.bootstrap)
            dx = exact["loss"] - intact["loss"][:, None]
            x, lo, hi = mean_ci(dx, counts, settings.ci)
            out["exact_loss_effect_range"] = [float(x.min()), float(x.max())]
            out["intact_loss"] = float(intact["loss"].mean())
            samples = layer_samples(L, H, settings.check_heads, settings.check_seed)
            est_rows = []
            for key, (est, c) in estimates.items():
                cost = nominal_passes(*METHODS[key], L)
                e = mean_ci(est, counts, settings.ci)[0]
                # what the atlas shows with this estimator: exact on the checked heads and failing layers
                shown, exact_mask, failed = checked_view(e, x, lo, hi, samples, H)
                checked = {f"checked_{k}": v for k, v in agreement(shown, x).items() if k != "n_compared"}
                est_rows.append(dict(agreement(e, x), method=key,
                                     forward=cost[0], backward=cost[1], cpu_s=c.cpu, passes_measured=c.cpu / unit,
                                     layers_failing_check=failed, exact_heads_with_check=int(exact_mask.sum()),
                                     **checked))  # fmt: skip
            out["estimators"] = est_rows
            metric = metrics_of(tname)[0]
            eff = x  # ablation order: smallest exact loss effect first
            orders = pruning_orders(specialisation(L, H, {}, None), eff, settings.seed)
            if not args.exact_from:
                with Clock() as c:
                    rem = removable_table(name, ev, values, orders["ablation"], settings).iloc[0]
                out["removable"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in rem.items()
                                    if k in ("metric", "tolerance", "unit", "intact", "n_heads", "n_removable", "share",
                                             "share_ci_low", "share_ci_high", "value", "first_failing", "n_evaluated")}  # fmt: skip
                out["removable"]["cpu_s"] = c.cpu
            if metric == "accuracy":
                acc = exact["correct"] - intact["correct"][:, None]
                out["exact_accuracy_effect_range"] = [float(acc.mean(0).min()), float(acc.mean(0).max())]
            results[f"{name}/{tname}"] = out
            print(f"\n## {name} ({tname}, {L} x {H} heads, {S} sequences)\n")
            if "exact_all_cpu_s" in out:
                print(f"one pass {unit:.2f} CPU-s; exact, every head (expanded): {out['exact_all_cpu_s']:.1f} CPU-s = "
                  f"{out['exact_all_passes']:.0f} passes ({out['expanded_cpu_s_per_head']:.2f} CPU-s/head; replicated "
                  f"inputs {out['replicated_cpu_s_per_head']:.2f} CPU-s/head)")  # fmt: skip
            print("| method | Spearman vs exact | top-10 overlap | largest error (nats) | mean error | passes (F+B) | "
                  "CPU-s | layers failing the check | checked: exact heads | checked: Spearman | checked: top-10 | "
                  "checked: largest error |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in est_rows:
                print(f"| {r['method']} | {r['spearman']:.3f} | {r['top_k_overlap']}/10 | {r['max_abs_error']:.3f} | "
                      f"{r['mean_abs_error']:.4f} | {r['forward']:g}+{r['backward']:g} | {r['cpu_s']:.1f} | "
                      f"{r['layers_failing_check']}/{L} | {r['exact_heads_with_check']} | {r['checked_spearman']:.3f} | "
                      f"{r['checked_top_k_overlap']}/10 | {r['checked_max_abs_error']:.3f} |")  # fmt: skip
            print(f"removable: {out.get('removable')}")
            Path(args.json).write_text(json.dumps({"machine": platform.platform(), "threads": args.threads,
                                                   "load_average_start": load_start,
                                                   "load_average_end": os.getloadavg(), "results": results}, indent=1,
                                                  default=str))  # fmt: skip


if __name__ == "__main__":
    main()
