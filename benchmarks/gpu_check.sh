#!/usr/bin/env bash
# The GPU checks, as run on a lent H200 (see benchmarks/README.md "Extraction"). Needs a Python with torch
# (CUDA), transformers, h5py, pandas and pytest; the weights cannot reach that machine,
# so .gpu/{minilm,smollm2} hold only each model's config and tokenizer, copied with
#   cp <model dir>/{config.json,tokenizer.json,tokenizer_config.json} .gpu/NAME/
# and the benchmark builds the model with random weights (same shapes, same speed).
# Writes logs and JSON under ${OUT:-benchmarks/gpu}.
set -uo pipefail
OUT=${OUT:-benchmarks/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/scripts PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
# CUDA results equal CPU results (tiny random models; skipped on machines without CUDA)
python3 -m pytest -q -p no:cacheprovider -rs -k cuda tests/test_extract.py tests/test_gradients.py 2>&1 | tee "$OUT/pytest_cuda.log"
bench() { python3 benchmarks/bench_extract.py --device cuda --random-weights --threads 1 "$@"; }
bench --model-dir .gpu/minilm --n 2000 --batch-size 16 --repeats 3 --json "$OUT/gpu_minilm_bs16.json" 2>&1 | tee "$OUT/gpu_minilm_bs16.md"
bench --model-dir .gpu/minilm --n 2000 --batch-size 128 --repeats 3 --json "$OUT/gpu_minilm_bs128.json" 2>&1 | tee "$OUT/gpu_minilm_bs128.md"
bench --model-dir .gpu/smollm2 --n 1000 --batch-size 32 --repeats 1 --head-repeats 3 --json "$OUT/gpu_smollm2_bs32.json" 2>&1 | tee "$OUT/gpu_smollm2_bs32.md"
