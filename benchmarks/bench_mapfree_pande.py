"""Pande's sieves alone: eager-fused vs map-free extraction vs the bare SDPA forward (CPU-seconds, one thread).

Run from the repository root with the project's environment::

    PYTHONPATH=scripts .venv/bin/python benchmarks/bench_mapfree_pande.py --out benchmarks/results_mapfree_pande.json

Inputs: the first ``--n`` (64) EWT dev sentences at max_length 128 (gold trees: every syntactic role), and the
same sentences as ``--n`` / 2 pairs (segment A, segment B, both trees: the block role, its value columns and
entropy pass). Per model and corpus, the modes run once per repetition, in rotation, on one loaded model
(``torch.set_num_threads(1)``); each mode's time is its fastest repetition (process CPU time):

- ``sdpa``: :func:`headatlas.core.reduce.bare_forward` with transformers' SDPA attention (the baseline);
- ``eager``: :func:`headatlas.core.reduce.fused_reduce` with the default :class:`SieveReducer`, ``path="eager"``;
- ``mapfree``: the same, ``path="mapfree"``.
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

EWT = REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
MODES = ("sdpa", "eager", "mapfree")


def pairs(recs):
    from headatlas.core.data import Record

    out = []
    for a, b in zip(recs[::2], recs[1::2]):
        s = len(a.words)
        out.append(
            Record(
                id=f"{a.id}+{b.id}",
                words=a.words + b.words,
                segment=(0,) * s + (1,) * len(b.words),
                head=a.head + tuple(h + s if h >= 0 else -1 for h in b.head),
                deprel=a.deprel + b.deprel,
            )
        )
    return out


def run_model(name: str, n: int, reps: int, cache: Path, batch_size: int) -> list[dict]:

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce
    from headatlas.pande.reducers import SieveReducer

    entry = dict(MODELS[name], name=name, max_length=128, batch_size=batch_size)
    if name in BOS:
        entry["bos_token"] = BOS[name]
    spec = ModelSpec.from_config(entry)
    model, tok, config = load(spec, model_dir(name, cache), device="cpu")
    kind = model_kind(config, spec)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    singles = sentence_records(read_conllu(EWT))[:n]
    out = []
    for corpus, recs in (("ewt", singles), ("ewt_pairs", pairs(singles))):
        tokenized, _ = tokenize_records(recs, tok, kind, 128, "truncate", decoder_bos(tok, config, spec))

        def run(mode: str, tokenized=tokenized, recs=recs, corpus=corpus) -> float:
            t0 = time.process_time()
            if mode == "sdpa":
                model.set_attn_implementation("sdpa")
                try:
                    bare_forward(model, tokenized, batch_size, pad)
                finally:
                    model.set_attn_implementation("eager")
            else:
                fused_reduce(model, tokenized, [SieveReducer()], batch_size, kind, recs, pad, name, corpus, path=mode)
            return time.process_time() - t0

        run("sdpa")  # warm-up
        times = {m: [] for m in MODES}
        for _ in range(reps):
            for m in MODES:
                times[m].append(run(m))
        best = {m: min(t) for m, t in times.items()}
        out.append(
            {
                "model": name,
                "corpus": corpus,
                "inputs": len(tokenized),
                "tokens": int(sum(len(t) for t in tokenized)),
                "batch_size": batch_size,
                "cpu_seconds": best,
                "all_cpu_seconds": times,
                "sdpa_over": {m: best["sdpa"] / best[m] for m in MODES},
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv=None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="minilm,smollm2")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "bench")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for m in args.models.split(",") for r in run_model(m, args.n, args.reps, args.cache, args.batch_size)]
    print("| model | corpus | SDPA forward | eager-fused sieves | map-free sieves | SDPA / map-free |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        s = r["cpu_seconds"]
        print(
            f"| {r['model']} | {r['corpus']} | {s['sdpa']:.2f} | {s['eager']:.2f} | {s['mapfree']:.2f} "
            f"| {r['sdpa_over']['mapfree']:.2f} |"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
