"""What loading a model costs a job: CPU-seconds of the imports, of the sealed cache's check and of
``from_pretrained`` from the model cache a workflow run wrote (``results/models/...``), each model in a fresh
process, as a job starts (the cost model's extraction has no term per parameter for it: docs/plan.md, "The
formulas").

Run from the repository root with the project's environment, on the model directories of a finished run::

    PYTHONPATH=scripts python benchmarks/bench_model_load.py RUN/results/models/gguf/qwen05 RUN/results/models/gguf/qwen15 \\
        --out benchmarks/results_model_load.json

The weights are memory-mapped (safetensors), so their pages are read as the first forward pass touches them: that
cost is in the forward's CPU-seconds, which the cost model counts per parameter and token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0, w0 = cpu(), time.time()
import torch, transformers
from headatlas.core.integrity import check_inputs
c1 = cpu()
check_inputs([sys.argv[1]])
c2 = cpu()
m = transformers.AutoModel.from_pretrained(sys.argv[1], dtype=torch.float32)
c3 = cpu()
print(json.dumps({"params": sum(p.numel() for p in m.parameters()), "imports_cpu_s": round(c1 - c0, 2),
                  "seal_check_cpu_s": round(c2 - c1, 2), "load_cpu_s": round(c3 - c2, 2),
                  "wall_s": round(time.time() - w0, 2)}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path, help="model directories a run wrote (results/models/...)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    rows = []
    for d in a.models:
        env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
        got = subprocess.run([sys.executable, "-c", CHILD, str(d)], capture_output=True, text=True, check=True, env=env)
        rows.append({"model": d.name, **json.loads(got.stdout.strip().splitlines()[-1])})
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
