"""Long inputs: Clark's surface statistics and the detectors on one SmolLM2 input of 8192 tokens, against the SDPA
forward (CPU, one thread; each mode in its own process, so each peak RSS is that mode's).

Run from the repository root with the project's environment, after ``snakemake results/models/gguf/smollm2``::

    PYTHONPATH=scripts .venv/bin/python benchmarks/bench_long.py --out benchmarks/results_long.json
    PYTHONPATH=scripts .venv/bin/python benchmarks/bench_long.py --length 2048 --modes sdpa,surface   # a shorter check

The input: WikiText-2 running text cut to the length (``wiki_long_segments``, the first of the extended config's
wiki_8192 kind). Modes (``time.process_time`` of the run, the model loaded before it):

- ``sdpa``: the model's forward with transformers' SDPA attention (the baseline);
- ``surface``: :func:`headatlas.core.reduce.fused_reduce` with Clark's ``SurfaceReducer`` alone (what a
  ``long_corpora`` corpus's extraction adds; smoothing 1e-4, the default: the smoothed entropy in the CPU
  attention pass, or without it from exact rows recomputed in blocks);
- ``surface_eps0``: the same with smoothing 0 (the unsmoothed entropy);
- ``detectors``: the ``DetectorReducer`` on the same natural input;
- ``detectors_job``: :func:`headatlas.detectors.analysis.run_detectors` with ``analysis.detectors.long``
  settings and one sequence per input kind (natural, random, repeated token, repeated: four inputs of the
  length), tables included: rule detectors_long's work per sequence of each kind (the extended config runs 4).

The path taken (map-free or eager) is read from the log. The machine may be shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_scaling import BOS, MODELS, WIKI, model_dir  # noqa: E402

MODES = ("sdpa", "surface", "surface_eps0", "detectors", "detectors_job")


class _Paths(logging.Handler):
    """Collects the path lines of ``core.reduce.open_feed`` ("... mapfree attention (...)")."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        msg = record.getMessage()
        if " attention (" in msg:
            self.lines.append(msg)


def one(name: str, length: int, mode: str, cache: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.corpora import wiki_long_segments
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce
    from headatlas.detectors.analysis import run_detectors
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.detectors.sequences import DetectorSettings, LongDetectorSettings

    paths = _Paths()
    logging.getLogger("headatlas").addHandler(paths)
    logging.getLogger("headatlas").setLevel(logging.INFO)
    entry = dict(MODELS[name], name=name, max_length=length, batch_size=1)
    if name in BOS:
        entry["bos_token"] = BOS[name]
    spec = ModelSpec.from_config(entry)
    model, tok, config = load(spec, model_dir(name, cache), device="cpu")
    kind = model_kind(config, spec)
    records = wiki_long_segments(WIKI, 1, length, seed=0)
    tokenized, _ = tokenize_records(records, tok, kind, length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    load_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c0, t0 = time.process_time(), time.perf_counter()
    if mode == "sdpa":
        model.set_attn_implementation("sdpa")
        bare_forward(model, tokenized, 1, pad)
    elif mode in ("surface", "surface_eps0", "detectors"):
        r = {"surface": SurfaceReducer(), "surface_eps0": SurfaceReducer(0.0), "detectors": DetectorReducer()}[mode]
        fused_reduce(model, tokenized, [r], 1, kind, None, pad, name, "wiki_long")
    elif mode == "detectors_job":
        long = LongDetectorSettings(n_sequences=1, batch_size=1)  # one input of each kind (no t-test: p NaN)
        run_detectors(spec, model, tok, config, {"wiki_long": records}, DetectorSettings(), long)
    else:
        raise SystemExit(f"unknown mode {mode!r}; one of {MODES}")
    return {
        "model": name,
        "length": length,
        "tokens": int(sum(len(t) for t in tokenized)),
        "mode": mode,
        "cpu_seconds": time.process_time() - c0,
        "seconds": time.perf_counter() - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_after_load": load_rss,
        "path": paths.lines,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "gguf")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # mode (the worker)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.model, args.length, args.one, args.cache)))
        return
    rows = []
    for mode in args.modes.split(","):
        load = os.getloadavg()
        cmd = [sys.executable, __file__, "--one", mode, "--model", args.model, "--length", str(args.length),
               "--cache", str(args.cache)]  # fmt: skip
        got = subprocess.run(cmd, capture_output=True, text=True)
        if got.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{got.stderr[-3000:]}")
        r = json.loads(got.stdout.strip().splitlines()[-1]) | {"load_before": load, "load_after": os.getloadavg()}
        rows.append(r)
        base = next((x["cpu_seconds"] for x in rows if x["mode"] == "sdpa"), None)
        ratio = f", SDPA / this {base / r['cpu_seconds']:.2f}" if base else ""
        print(f"{args.model} {args.length} {mode}: {r['cpu_seconds']:.1f} CPU-s ({r['seconds']:.1f} s wall){ratio}, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB (after load {r['peak_rss_mb_after_load']:.0f}), "
              f"load {load[0]:.1f} -> {r['load_after'][0]:.1f}; {'; '.join(r['path'])}", flush=True)  # fmt: skip
        if args.out:
            args.out.write_text(json.dumps({"threads": 1, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
