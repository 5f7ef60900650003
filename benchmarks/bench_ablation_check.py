"""What the atlas would show with checked estimates, for several check settings, against exact ablation.

Reads a ``heads.tsv`` of rule ``ablation_heads`` made with exact ablation of every head (the default for
SmolLM2 and minilm-sst2): its ``estimate`` column (the first of ``compare_estimators``) and its exact effects
with their CIs. For every check setting (heads checked per layer, seeds of the draw, the layer test:
``headatlas.ablation.analysis.layer_check``) it builds what ``head_tables`` would show (exact values for the checked heads and
for every head of a failing layer, the checked estimates elsewhere) and compares it with exact ablation of every
head: Spearman, top-10 overlap, largest error, and the exact heads it costs. No model runs::

    PYTHONPATH=scripts python benchmarks/bench_ablation_check.py results/ablation/smollm2/heads.tsv \
        --json benchmarks/results_ablation_check_smollm2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from headatlas.ablation.analysis import agreement, layer_check
from headatlas.ablation.patch import layer_samples
from headatlas.core.io import head_shape


def checked_view(e, x, lo, hi, samples: list[list[int]], n_heads: int) -> tuple[np.ndarray, np.ndarray, int]:
    """What the atlas shows with an estimate ``e`` [L * H] checked on ``samples`` against the exact effects ``x``
    (CI ``lo``..``hi``), ``on_check_fail: exact``: (the values, the [L, H] mask of exact ones, failing layers)."""
    lc = layer_check(e, x, lo, hi, samples, n_heads)
    exact = np.zeros((len(samples), n_heads), bool)
    for lay, hs in enumerate(samples):
        exact[lay, hs] = True
    failed = lc.loc[~lc["passed"], "layer"].astype(int).to_numpy()
    exact[failed] = True
    return np.where(exact.ravel(), x, e), exact, len(failed)


def shown_values(t: pd.DataFrame, k: int, seed: int) -> tuple[np.ndarray, int, int]:
    """(the values shown, exact heads, failing layers) of one check setting on a heads table (one task, loss)."""
    L, H = head_shape(t)
    t = t.sort_values(["layer", "head"])
    e, x = t["estimate"].to_numpy(float), t["exact"].to_numpy(float)
    lo, hi = t["exact_ci_low"].to_numpy(float), t["exact_ci_high"].to_numpy(float)
    shown, exact, failed = checked_view(e, x, lo, hi, layer_samples(L, H, k, seed), H)
    return shown, int(exact.sum()), failed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+", help="heads.tsv files of rule ablation_heads (exact everywhere)")
    ap.add_argument("--check-heads", default="2,3,4")
    ap.add_argument("--seeds", type=int, default=10, help="check draws per setting (seeds 0..N-1)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = []
    for path in args.heads:
        t = pd.read_csv(path, sep="\t")
        t = t[(t["metric"] == "loss") & (t["status"] == "ok")]
        for task, tt in t.groupby("task"):
            assert (tt["kind"] == "exact").all(), f"{path}: not exact everywhere"
            x = tt.sort_values(["layer", "head"])["exact"].to_numpy(float)
            e = tt.sort_values(["layer", "head"])["estimate"].to_numpy(float)
            base = agreement(e, x)
            print(f"{path} {task}: {len(x)} heads, unchecked estimate Spearman {base['spearman']:.3f}")
            for k in (int(v) for v in args.check_heads.split(",")):
                rows = [shown_values(tt, k, seed) for seed in range(args.seeds)]
                ag = [agreement(v, x) for v, _, _ in rows]
                rho = np.array([a["spearman"] for a in ag])
                r = {"heads_file": path, "task": task, "n_heads": len(x), "check_heads": k, "seeds": args.seeds,
                     "spearman_seed0": float(rho[0]), "spearman_mean": float(rho.mean()),
                     "spearman_min": float(rho.min()), "top10_mean": float(np.mean([a["top_k_overlap"] for a in ag])),
                     "max_abs_error_mean": float(np.mean([a["max_abs_error"] for a in ag])),
                     "exact_heads_mean": float(np.mean([n for _, n, _ in rows])), "exact_heads_seed0": rows[0][1],
                     "failing_layers_mean": float(np.mean([f for _, _, f in rows]))}  # fmt: skip
                out.append(r)
                print(f"  check {k}: Spearman {r['spearman_mean']:.3f} (min {r['spearman_min']:.3f}, seed 0 "
                      f"{r['spearman_seed0']:.3f}), top-10 {r['top10_mean']:.1f}, largest error "
                      f"{r['max_abs_error_mean']:.3f}, exact heads {r['exact_heads_mean']:.0f} (seed 0 "
                      f"{r['exact_heads_seed0']}), failing layers {r['failing_layers_mean']:.1f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
