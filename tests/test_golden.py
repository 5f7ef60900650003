"""Golden check: the tiny workflow's TSVs are byte-identical to the recorded ones.

tests/golden/tiny_outputs.json holds the sha256 of every TSV a small tiny configuration
writes (two random models; Clark surface and syntax, Pande, the atlas; Jo & Myaeng is left
out: its probes need more records than the tiny corpora keep). A refactoring must leave it
unchanged. When a change of outputs is intended (a tokenizer fix, a new column), refresh it
on purpose and commit the new file with the change:

    PYTHONPATH=scripts python tests/test_golden.py --refresh

(``--keep DIR`` runs in DIR and keeps the results, to inspect or compare them with
``python tests/tiny_workflow.py compare``.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GOLDEN = HERE / "golden" / "tiny_outputs.json"
ANALYSES = ["clark_surface", "pande", "clark_syntax"]
LIMIT = 12  # the tiny default: the same records as `tiny_workflow.py build`


def run_tiny(out: Path, cores: int = 2) -> Path:
    """Build the golden tiny configuration under ``out``, run the workflow, return results/."""
    sys.path.insert(0, str(HERE))
    from tiny_workflow import write_tiny

    config = write_tiny(out, limit=LIMIT, analyses=ANALYSES)
    if not (out / "resources").exists():
        (out / "resources").symlink_to(REPO / "resources")
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"), HF_HUB_OFFLINE="1")
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(out),
        "--configfile",
        str(config),
        "--cores",
        str(cores),
        "--quiet",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"tiny workflow failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    return out / "results"


def digests(results: Path) -> dict[str, str]:
    """sha256 of every TSV under ``results`` (relative path -> hex digest), except the jobs'
    benchmark files (results/benchmarks/: timings)."""
    return {
        str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(results.rglob("*.tsv"))
        if p.relative_to(results).parts[0] != "benchmarks"
    }


def differences(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    out = [f"missing now: {k}" for k in sorted(recorded.keys() - now.keys())]
    out += [f"new: {k}" for k in sorted(now.keys() - recorded.keys())]
    out += [f"changed: {k}" for k in sorted(recorded.keys() & now.keys()) if recorded[k] != now[k]]
    return out


@pytest.mark.slow
def test_tiny_outputs_match_the_golden_digests(golden_results):
    recorded = json.loads(GOLDEN.read_text())
    assert recorded["analyses"] == ANALYSES and recorded["limit"] == LIMIT, (
        f"{GOLDEN} was made for another configuration; refresh it"
    )
    problems = differences(recorded["tsv_sha256"], digests(golden_results))
    assert not problems, (
        "tiny outputs differ from tests/golden/tiny_outputs.json (if intended: PYTHONPATH=scripts python tests/test_golden.py --refresh):\n"
        + "\n".join(problems)
    )


def test_differences_name_every_kind_of_change():
    assert differences({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["new: c", "changed: b"]
    assert differences({"a": "1"}, {}) == ["missing now: a"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="refresh tests/golden/tiny_outputs.json from a fresh tiny run")
    parser.add_argument("--refresh", action="store_true", required=True)
    parser.add_argument("--keep", help="run in this directory and keep it (default: a temporary one)")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep).resolve() if args.keep else Path(tmp)
        found = digests(run_tiny(out, args.cores))
    old = json.loads(GOLDEN.read_text())["tsv_sha256"] if GOLDEN.exists() else {}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = GOLDEN.with_suffix(".tmp")
    tmp_path.write_text(
        json.dumps({"analyses": ANALYSES, "limit": LIMIT, "tsv_sha256": found}, indent=1, sort_keys=True) + "\n"
    )
    os.replace(tmp_path, GOLDEN)
    changes = differences(old, found)
    print(f"{GOLDEN}: {len(found)} TSVs; {len(changes)} changes" + "".join(f"\n  {c}" for c in changes))


if __name__ == "__main__":
    main()
