"""Golden check: the tiny workflow's TSVs are byte-identical to the recorded ones.

tests/golden/tiny_outputs.json holds the sha256 of every TSV the tiny configuration writes: two random
models through every analysis of the default config's ``analysis:`` block and the atlas (``run_tiny``).
The same run is shared by the slow tests that read a whole run (conftest's ``golden_results``: these
digests, and test_golden_run.py: the atlas and stability end-to-end checks, the ablation rules, the fused-vs-full
comparison, the atlas page in a browser, no clipped figure), so the suite pays for one tiny run of every analysis. A refactoring must leave the digests
unchanged. When a change of outputs is intended (a tokenizer fix, a new column), refresh it on purpose and
commit the new file with the change:

    PYTHONPATH=scripts python tests/acceptance/test_golden.py --refresh

(``--keep DIR`` runs in DIR and keeps the results, to inspect or compare them with
``python tests/tiny_workflow.py compare``.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]  # the tests' helpers (tiny_workflow, conftest) and golden/
REPO = TESTS.parent
GOLDEN = TESTS / "golden" / "tiny_outputs.json"
ANALYSES = ["clark_surface", "pande", "jomyaeng", "detectors", "clark_syntax", "ablation", "circuits", "icl", "quiet"]
LIMIT = 12  # the tiny default: the same records as `tiny_workflow.py build`
# files in the checkout's results/ that the run must neither read nor depend on (its own results/ is elsewhere)
FOREIGN = ("results/probing/sentences.jsonl.gz", "results/probing/downstream_sentences.jsonl.gz")


def run_tiny(out: Path, cores: int = 2) -> Path:
    """Build the golden tiny configuration under ``out`` and run the workflow; return results/.

    Every analysis of the default config (``ANALYSES``, checked against it), configured from a copy of the
    default config in a checkout (``out``/checkout) that holds a finished run's files (``FOREIGN``).
    """
    sys.path.insert(0, str(TESTS))
    import tiny_workflow

    checkout = out / "checkout"
    (checkout / "config").mkdir(parents=True, exist_ok=True)
    (checkout / "config" / "config.yaml").write_bytes((REPO / "config" / "config.yaml").read_bytes())
    if not (checkout / "resources").exists():
        (checkout / "resources").symlink_to(REPO / "resources")
    for rel in FOREIGN:
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_bytes(b"a finished run's file, not the tiny run's")
    import yaml

    default = list(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["analysis"])
    if default != ANALYSES:
        raise RuntimeError(f"the default config's analyses are {default}; update test_golden.ANALYSES and refresh")
    run = out / "run"
    run.mkdir(parents=True, exist_ok=True)
    repo, tiny_workflow.REPO = tiny_workflow.REPO, checkout  # the config's relative paths resolve in the checkout
    try:
        config = tiny_workflow.write_tiny(run, limit=LIMIT, analyses=ANALYSES)
    finally:
        tiny_workflow.REPO = repo
    if not (run / "resources").exists():  # the analysis block's relative resources/ paths
        (run / "resources").symlink_to(REPO / "resources")
    from conftest import run_snakemake

    env = {"PYTHONPATH": str(REPO / "scripts"), "HF_HUB_OFFLINE": "1"}
    proc = run_snakemake(run, None, "--configfile", str(config), "--quiet", cores=cores, timeout=3600, env=env)
    if proc.returncode:
        raise RuntimeError(f"tiny workflow failed ({' '.join(proc.args)}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    return run / "results"


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
        "tiny outputs differ from tests/golden/tiny_outputs.json (if intended: PYTHONPATH=scripts python tests/acceptance/test_golden.py --refresh):\n"
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
