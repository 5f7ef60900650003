"""Clark's syntax reducers map-free against eager-fused and the SDPA forward (CPU-seconds, one thread).

Run from the repository root with the project's environment::

    PYTHONPATH=scripts python benchmarks/bench_mapfree_syntax.py --out benchmarks/results_mapfree_syntax.json

Per model (MiniLM, SmolLM2) and reducer alone: Table 1's head predictions and Table 3's word maps on the first
64 EWT dev sentences at 128 tokens, Table 2's coreference on OntoGUM dev documents (``--docs``, at 128 and
512 tokens: EWT sentences have no mentions). Modes, in rotation, ``--reps`` times, each mode's fastest
repetition in CPU-seconds (``time.process_time``, ``torch.set_num_threads(1)``):

- ``sdpa``: :func:`headatlas.core.reduce.bare_forward` with transformers' SDPA attention (the baseline);
- ``eager``: the same forward with eager attention;
- ``eager_fused``: :func:`headatlas.core.reduce.fused_reduce` with ``path="eager"`` (the maps exist);
- ``mapfree``: the same with ``path="mapfree"`` (word maps: one value pass with a column per unit of the
  widest sequence; coreference: no extra pass, the anaphors' head-word rows from q, k and LSE).
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
GUM = REPO / "resources" / "gum" / "ontogum_dev.conllu"
MODES = ("sdpa", "eager", "eager_fused", "mapfree")


def cpu_seconds(mode, model, tokenized, reducers, batch_size, kind, records, pad) -> float:
    """CPU-seconds of one mode (module docstring) over ``tokenized``."""
    from headatlas.core.reduce import bare_forward, fused_reduce

    t0 = time.process_time()
    if mode in ("sdpa", "eager"):
        model.set_attn_implementation(mode)
        try:
            bare_forward(model, tokenized, batch_size, pad)
        finally:
            model.set_attn_implementation("eager")
    else:
        fused_reduce(model, tokenized, reducers, batch_size, kind, records, pad, path=mode.split("_")[0])
    return time.process_time() - t0


def main() -> None:
    import torch

    from headatlas.clark.syntax_reducers import CorefReducer, HeadPredictionReducer, WordMapsReducer
    from headatlas.core.corpora import document_records, read_conllu, sentence_records
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "bench")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ewt = sentence_records(read_conllu(EWT))[: args.sentences]
    gum = document_records(read_conllu(GUM))[: args.docs]
    settings = [
        ("clark_syntax_heads", lambda: [HeadPredictionReducer()], ewt, 128),
        ("clark_syntax_word_maps", lambda: [WordMapsReducer()], ewt, 128),
        ("clark_syntax_coref", lambda: [CorefReducer()], gum, 128),
        ("clark_syntax_coref", lambda: [CorefReducer()], gum, 512),
    ]
    rows = []
    for name in args.models.split(","):
        entry = dict(MODELS[name], name=name, max_length=512, batch_size=args.batch_size)
        if name in BOS:
            entry["bos_token"] = BOS[name]
        spec = ModelSpec.from_config(entry)
        model, tok, config = load(spec, model_dir(name, args.cache), device="cpu")
        kind = model_kind(config, spec)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        for reducer, make, records, length in settings:
            tokenized, _ = tokenize_records(
                records, tok, kind, length, "truncate", decoder_bos(tok, config, spec)
            )  # fmt: skip
            bs = args.batch_size if length <= 128 else max(1, args.batch_size // 4)

            best = {m: float("inf") for m in MODES}
            for _ in range(args.reps):
                for m in MODES:
                    best[m] = min(best[m], cpu_seconds(m, model, tokenized, make(), bs, kind, records, pad))
            row = {"model": name, "reducer": reducer, "inputs": len(tokenized), "length": length, "batch_size": bs}
            row |= {f"{m}_cpu_s": round(best[m], 3) for m in MODES}
            row["eager_fused_over_sdpa"] = round(best["sdpa"] / best["eager_fused"], 3)
            row["mapfree_over_sdpa"] = round(best["sdpa"] / best["mapfree"], 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        args.out.write_text(json.dumps({"threads": 1, "device": "cpu", "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
