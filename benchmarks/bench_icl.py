"""Benchmark function-vector patching: CPU seconds per head and prompt, and attribution patching against exact.

Run from the repository root with the project's environment, after the model exists (rule cache_model)::

    . .venv/bin/activate
    snakemake --cores 1 results/models/gguf/smollm2
    python benchmarks/bench_icl.py --tasks capitalise plural --n-prompts 4 --heads-per-layer 2

With one torch thread (as the rules run) it measures CPU seconds of the process (the machine may be shared: wall
times are given too but mean little then): the task table (clean and corrupted passes, the means), one unpatched
pass over the pooled corrupted prompts, attribution patching of every head (one forward and one backward pass),
and batched exact patching of ``--heads-per-layer`` seeded heads of every layer (the layer check's heads); then
Spearman's rho and the top-10 overlap of the estimate against the exact values on those heads.
Results go to stdout and to ``--json`` (default ``benchmarks/results_icl.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import headatlas  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "scripts"))


def main() -> None:
    import numpy as np
    import torch

    from headatlas.ablation.analysis import agreement, exact_heads
    from headatlas.core.models import ModelSpec
    from headatlas.icl.analysis import IclSettings, load_decoder, pooled_corrupted, prepare_tasks, task_table
    from headatlas.icl.tasks import FILE_TASKS, task_pairs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="results/models/gguf/smollm2")
    ap.add_argument("--tasks", nargs="+", default=["capitalise", "plural"])
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--heads-per-layer", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results_icl.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    spec = ModelSpec.from_config({"name": "smollm2", "source": {"path": a.model_dir}, "bos_token": "<|endoftext|>"})
    (model, tok, bos), _, (L, H) = load_decoder(spec, None, "cpu")
    s = IclSettings(tasks=tuple(a.tasks), n_prompts=a.n_prompts, min_accuracy=0.0, min_pairs=0, exact_max_heads=0,
                    check_heads=a.heads_per_layer)  # fmt: skip
    ewt = sorted(str(p) for p in (REPO / "resources" / "ud_english_ewt").glob("*.conllu*"))
    pairs = task_pairs(list(s.tasks), ewt, {t: REPO / f"resources/icl/{t}.tsv" for t in FILE_TASKS})
    out = {"machine": platform.node(), "model": "smollm2", "layers": L, "heads": H, "tasks": a.tasks,
           "n_prompts_per_task": a.n_prompts}  # fmt: skip

    def timed(name, f):
        c, w = time.process_time(), time.time()
        r = f()
        out[name] = {"cpu_s": round(time.process_time() - c, 2), "wall_s": round(time.time() - w, 2)}
        print(name, out[name], flush=True)
        return r

    runs = prepare_tasks(model, tok, bos, pairs, s, L, H)
    tasks, means = timed("task_table", lambda: task_table("smollm2", runs, s))
    out["accuracy"] = dict(zip(tasks["task"], tasks["accuracy"].round(3)))
    ev = pooled_corrupted(model, runs, means, s, L, H)
    S = ev.n_sequences
    out["prompts"] = S
    out["tokens_per_prompt"] = float(np.mean([b[0]["input_ids"].shape[1] for b in ev.batches]))
    timed("unpatched_pass", ev.run)
    est = timed("atp_every_head", lambda: ev.estimate(ev.values))
    flat = exact_heads(ev, s.ablation())
    corrupted = ev.run()["loss"]
    exact = timed("exact_sampled_heads", lambda: ev.exact(flat, ev.values, s.exact_max_rows))["loss"]
    out["exact_heads"] = len(flat)
    per = out["exact_sampled_heads"]["cpu_s"] / (len(flat) * S)
    out["exact_cpu_s_per_head_and_prompt"] = round(per, 4)
    out["atp_cpu_s_per_prompt_all_heads"] = round(out["atp_every_head"]["cpu_s"] / S, 4)
    out["unpatched_cpu_s_per_prompt"] = round(out["unpatched_pass"]["cpu_s"] / S, 4)
    aie = (exact - corrupted[:, None]).mean(0)
    ag = agreement(est.mean(0)[flat], aie)
    out["atp_vs_exact"] = {k: (round(float(v), 4) if isinstance(v, float) else v) for k, v in ag.items()}
    out["exact_every_head_cpu_s_estimate"] = round(per * L * H * S, 1)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    print(json.dumps(out, indent=1))
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
