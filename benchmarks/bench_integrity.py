"""Benchmark the planning-time integrity check (docs/integrity.md): what every ``snakemake`` invocation pays to
find damaged sealed outputs under ``results/`` (``headatlas.core.integrity.damaged``).

Run from the repository root with the project's environment::

    python benchmarks/bench_integrity.py --files 200 --mib 1 --repeats 5

Writes ``--files`` sealed files of ``--mib`` MiB of random bytes each through ``core.io.atomic_path`` into a
temporary ``results/`` (10 folders), then times ``damaged("results")`` (every checksum, from the page cache) and
reports the median seconds and the throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from headatlas.core.integrity import damaged
from headatlas.core.io import atomic_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for i in range(args.files):
            with atomic_path(Path("results", f"m{i % 10}", f"t{i}.h5")) as out:
                out.write_bytes(rng.bytes(int(args.mib * 2**20)))
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            assert damaged("results") == []
            times.append(time.perf_counter() - t)
    seconds = statistics.median(times)
    total = args.files * args.mib
    print(json.dumps({"files": args.files, "MiB": total, "median_s": round(seconds, 3),
                      "MiB_per_s": round(total / seconds), "load": os.getloadavg()[0]}))  # fmt: skip


if __name__ == "__main__":
    main()
