#!/usr/bin/env bash
# Format and lint the whole tree once, on purpose (the lead runs this after merging the
# parallel branches; CI then only checks). Run from anywhere with the dev extra installed:
#   bash scripts/lint.sh          # fix: ruff check --fix, ruff format, snakefmt
#   bash scripts/lint.sh --check  # what CI runs (.ci/run): change nothing, fail on a finding
# Formatting changes no output; prove it with the golden check afterwards:
#   python -m pytest -q tests/acceptance/test_golden.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ "${1:-}" = "--check" ]; then
    $PY -m ruff check .
    $PY -m ruff format --check .
    $PY -m snakefmt --check Snakefile workflow/rules
else
    $PY -m ruff check --fix .
    $PY -m ruff format .
    $PY -m snakefmt Snakefile workflow/rules
    $PY -m ruff check .  # what --fix cannot fix (reported, to be fixed by hand)
fi
