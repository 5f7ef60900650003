"""The quiet-heads reducers' cost (CPU, one thread, modes in rotation in one process): what the row maxima
(exact rows recomputed from q, k and the LSE in blocks) add to the map-free pass, and what the output-norm hooks and
the massive-activation scan add.

Run from the repository root with the project's environment (SmolLM2 read from the workflow's cache,
``results/models/gguf/smollm2``, or dequantised into ``--cache``)::

    PYTHONPATH=scripts python benchmarks/bench_quiet.py --out benchmarks/results_quiet.json

Inputs: the default config's quiet (and detectors) inputs, the first 64 records of the workflow's ``wiki`` corpus
(``results/corpora/wiki.jsonl.gz``, rule prepare_corpus) cut to 64 tokens. Modes, each :func:`headatlas.core.reduce.fused_reduce` over all inputs, batch 16:

- ``free_entropy``: map-free, the entropy pass alone (the baseline);
- ``free_rows``: map-free, :class:`~headatlas.quiet.reducers.RowMaxReducer` (the entropy pass and the row blocks);
- ``free_all``: map-free, the row maxima and :class:`~headatlas.quiet.reducers.ActivityReducer` (rule quiet);
- ``eager_all``: the eager path with both reducers (the maps).

Each mode's CPU time (``time.process_time``) is its fastest of ``--reps`` rotations after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_scaling import BOS, MODELS, model_dir  # noqa: E402

MODES = ("free_entropy", "free_rows", "free_all", "eager_all")


def main() -> None:
    import torch

    from headatlas.core.batching import pad_token
    from headatlas.core.data import load_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import fused_reduce
    from headatlas.core.reducer import Needs, Reducer
    from headatlas.quiet.analysis import QuietSettings, natural_inputs
    from headatlas.quiet.reducers import ActivityReducer, RowMaxReducer

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "gguf")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=64, help="the first N inputs (default: all 64)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)

    class EntropyPass(Reducer):  # the entropy pass alone (its result is discarded)
        name = "entropy_pass"

        def layer_needs(self, batch, causal):
            return Needs(entropy=True)

        def update(self, layer, view, batch):
            view.entropy()

        def result(self):
            return None

    name = args.model
    spec = ModelSpec.from_config(dict(MODELS[name], name=name, max_length=128, bos_token=BOS.get(name)))
    model, tokenizer, config = load(spec, cache_dir=model_dir(name, args.cache), device="cpu")
    kind = model_kind(config, spec)
    records = load_records(REPO / "results" / "corpora" / "wiki.jsonl.gz")
    s = QuietSettings(n_sequences=args.sequences)
    tokenized, _ = natural_inputs({"wiki": records}, tokenizer, kind, decoder_bos(tokenizer, config, spec), s)
    pad = pad_token(tokenizer)

    def run(mode: str) -> float:
        made = {
            "free_entropy": lambda: [EntropyPass()],
            "free_rows": lambda: [RowMaxReducer()],
            "free_all": lambda: [RowMaxReducer(), ActivityReducer(model)],
            "eager_all": lambda: [RowMaxReducer(), ActivityReducer(model)],
        }[mode]()
        path = "eager" if mode.startswith("eager") else "mapfree"
        t0 = time.process_time()
        fused_reduce(model, tokenized, made, s.batch_size, kind, None, pad, name, "bench", path=path)
        return time.process_time() - t0

    for mode in MODES:  # warm-up
        run(mode)
    best = {m: min(run(m) for _ in range(args.reps)) for m in MODES}
    out = {
        "model": name,
        "inputs": len(tokenized),
        "tokens": sum(len(t) for t in tokenized),
        "cpu_s": best,
        "ratio_to_free_entropy": {m: best[m] / best["free_entropy"] for m in MODES},
    }
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
