"""Clark's surface statistics (SurfaceReducer alone) eager-fused vs map-free vs the SDPA forward, CPU-seconds,
one thread, modes alternating in one process; the smoothed (eps = 1e-4) against the unsmoothed (eps = 0) entropy
per head.

Run from the repository root with the project's environment::

    PYTHONPATH=scripts .venv/bin/python benchmarks/bench_mapfree_surface.py --out benchmarks/results_mapfree_surface.json

Settings (``--runs model:corpus:length:inputs``): ``ewt`` = the first EWT dev sentences at max_length ``length``,
``wiki`` = WikiText-2 running text cut to ``length`` tokens. Modes per setting, each its fastest of ``--reps``
repetitions (CPU-seconds, ``time.process_time``):

- ``sdpa``: :func:`headatlas.core.reduce.bare_forward` with transformers' SDPA attention (the baseline);
- ``eager``: ``fused_reduce(..., path="eager")`` with ``SurfaceReducer()`` (eps = 1e-4, the reference);
- ``mapfree``: ``fused_reduce(..., path="mapfree")``, the same reducer (the smoothed entropy in the CPU attention
  pass, :mod:`headatlas.core.cpu_pass`);
- ``mapfree_eps0``: the map-free path with ``SurfaceReducer(0.0)`` (the unsmoothed entropy);
- ``mapfree_torch``: the map-free path without the CPU attention pass (as without a C compiler: the kernel,
  and the smoothed entropy from exact rows recomputed in blocks, ``FreeLayer.smoothed_entropy``).

Also per setting the max difference map-free vs eager of every statistic (absolute), and per head the smoothed
minus the unsmoothed entropy (``entropy`` and ``cls_entropy`` columns of the eager tables; max and mean over heads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_scaling import BOS, MODELS, WIKI, model_dir  # noqa: E402

EWT_DEV = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
MODES = ("sdpa", "eager", "mapfree", "mapfree_eps0", "mapfree_torch")


def absdiff(a, b) -> float:
    """Max abs difference of two columns where both are defined (0 where a statistic is undefined: NaN)."""
    import numpy as np

    d = np.abs(a.to_numpy(float) - b.to_numpy(float))
    return float(np.nanmax(d)) if np.isfinite(d).any() else 0.0


def run_setting(name: str, corpus: str, length: int, n_inputs: int, reps: int, batch_size: int, cache: Path) -> dict:
    import numpy as np

    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.clark.surface import STATS
    from headatlas.core import cpu_pass
    from headatlas.core.corpora import read_conllu, sentence_records, wiki_long_segments
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce

    entry = dict(MODELS[name], name=name, max_length=length, batch_size=batch_size)
    if name in BOS:
        entry["bos_token"] = BOS[name]
    spec = ModelSpec.from_config(entry)
    model, tok, config = load(spec, model_dir(name, cache), device="cpu")
    kind = model_kind(config, spec)
    if corpus == "ewt":
        records = sentence_records(read_conllu(EWT_DEV))[:n_inputs]
    else:
        records = wiki_long_segments(WIKI, n_inputs, length, seed=0)
    tokenized, _ = tokenize_records(records, tok, kind, length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    built = cpu_pass.library

    def run(mode: str):
        c = time.process_time()
        if mode == "sdpa":
            model.set_attn_implementation("sdpa")
            try:
                bare_forward(model, tokenized, batch_size, pad)
            finally:
                model.set_attn_implementation("eager")
            return time.process_time() - c, None
        path = "eager" if mode == "eager" else "mapfree"
        r = SurfaceReducer(0.0 if mode == "mapfree_eps0" else 1e-4)
        cpu_pass.library = (lambda: None) if mode == "mapfree_torch" else built
        try:
            res = fused_reduce(model, tokenized, [r], batch_size, kind, records, pad, name, corpus, path=path)[0]
        finally:
            cpu_pass.library = built
        return time.process_time() - c, res

    run("sdpa")  # warm-up
    times = {m: [] for m in MODES}
    tables = {}
    for _ in range(reps):
        for m in MODES:
            t, res = run(m)
            times[m].append(t)
            tables[m] = res
    best = {m: min(t) for m, t in times.items()}
    eager0 = fused_reduce(
        model, tokenized, [SurfaceReducer(0.0)], batch_size, kind, records, pad, name, corpus, path="eager"
    )[0]
    diff0 = max(absdiff(eager0[s], tables["mapfree_eps0"][s]) for s in STATS)
    e, f = tables["eager"], tables["mapfree"]
    diff = {s: absdiff(e[s], f[s]) for s in STATS}
    diff_torch = {s: absdiff(e[s], tables["mapfree_torch"][s]) for s in STATS}
    smooth = {}
    for s in ("entropy", "cls_entropy"):
        d = (e[s] - eager0[s]).to_numpy()
        smooth[s] = {
            "max": float(np.nanmax(np.abs(d))),
            "mean": float(np.nanmean(np.abs(d))),
            "signed_mean": float(np.nanmean(d)),
        }
    return {
        "model": name,
        "corpus": corpus,
        "length": length,
        "inputs": len(tokenized),
        "tokens": int(sum(len(t) for t in tokenized)),
        "batch_size": batch_size,
        "cpu_seconds": best,
        "all_cpu_seconds": times,
        "ratio_to_sdpa": {m: best["sdpa"] / best[m] for m in MODES},
        "max_abs_diff_mapfree_vs_eager": diff,
        "max_abs_diff_mapfree_torch_vs_eager": diff_torch,
        "max_abs_diff_mapfree_vs_eager_eps0": diff0,
        "smoothed_minus_unsmoothed_per_head": smooth,
    }


def main(argv=None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="minilm:ewt:128:64,smollm2:ewt:128:64,minilm:wiki:128:16,minilm:wiki:512:4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "bench")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for item in args.runs.split(","):
        name, corpus, length, n = item.split(":")
        r = run_setting(name, corpus, int(length), int(n), args.reps, args.batch_size, args.cache)
        results.append(r)
        c = r["cpu_seconds"]
        print(
            f"{name} {corpus} {length} x{r['inputs']} ({r['tokens']} tokens): "
            + "  ".join(f"{m} {c[m]:.2f}" for m in MODES)
            + f" CPU-s; max diff {max(r['max_abs_diff_mapfree_vs_eager'].values()):.2e}"
            f" (without the pass {max(r['max_abs_diff_mapfree_torch_vs_eager'].values()):.2e});"
            f" smoothed - unsmoothed entropy per head: {r['smoothed_minus_unsmoothed_per_head']}",
            flush=True,
        )
        if args.out:
            args.out.write_text(json.dumps({"threads": 1, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
