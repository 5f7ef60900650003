"""Golden check: the tiny workflow's TSVs are byte-identical to the recorded ones.

tests/golden/tiny_outputs.json holds the sha256 of every TSV the tiny configuration writes: two random
models through every analysis of the default config's ``analysis:`` block and the atlas (``run_tiny``), one set
per kind of processor it was recorded on (``machines``: torch's kernels and the CPU attention pass round
differently on AMD and Intel processors and on other vector widths, so about a fifth of the tables differ in their
last digits between machines); a run must match one of the sets byte for byte.
The same run is shared by the slow tests that read a whole run (conftest's ``golden_results``: these
digests, and test_golden_run.py: the atlas and stability end-to-end checks, the ablation rules, the fused-vs-full
comparison, the atlas page in a browser, no clipped figure), so the suite pays for one tiny run of every analysis. A refactoring must leave the digests
unchanged. When a change of outputs is intended (a tokenizer fix, a new column), refresh it on purpose and
commit the new file with the change:

    PYTHONPATH=scripts python tests/acceptance/test_golden.py --refresh

(``--keep DIR`` runs in DIR and keeps the results, to inspect or compare them with
``python tests/tiny_workflow.py compare``.) ``--refresh`` replaces the set of this kind of processor and keeps
the others: after an intended change of outputs, refresh on each kind of machine CI runs on (or delete the stale
sets from the file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
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


def machine() -> tuple[str, str]:
    """(key, label) of this kind of processor: its vendor, model name and instruction sets."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    label = f"{info.get('vendor_id', platform.machine())} {info.get('model name', platform.processor())}".strip()
    flags = info.get("flags", info.get("Features", ""))
    return hashlib.sha256(f"{label} {flags}".encode()).hexdigest()[:12], label


def recorded_sets(doc: dict) -> dict[str, dict]:
    """The file's digest sets by machine key (a file from before the keys: its one set as 'unkeyed')."""
    if "machines" in doc:
        return doc["machines"]
    return {"unkeyed": {"cpu": "recorded before machine keys", "tsv_sha256": doc.get("tsv_sha256", {})}}


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
    now, (key, label) = digests(golden_results), machine()
    sets = recorded_sets(recorded)
    found = {k: differences(v["tsv_sha256"], now) for k, v in sets.items()}
    if any(not d for d in found.values()):
        return
    closest = key if key in found else min(found, key=lambda k: len(found[k]))
    where = "this processor's set" if closest == key else f"the closest set ({sets[closest]['cpu']}); none for {label}"
    raise AssertionError(
        f"tiny outputs differ from every set of tests/golden/tiny_outputs.json; against {where}: "
        "(if intended: PYTHONPATH=scripts python tests/acceptance/test_golden.py --refresh):\n"
        + "\n".join(found[closest])
    )


def test_digest_sets_by_kind_of_processor():
    """The recorded file keeps a set per kind of processor; a file from before the keys is one 'unkeyed' set."""
    key, label = machine()
    assert len(key) == 12 and label and machine() == (key, label)
    assert recorded_sets({"tsv_sha256": {"a.tsv": "1"}}) == {
        "unkeyed": {"cpu": "recorded before machine keys", "tsv_sha256": {"a.tsv": "1"}}}  # fmt: skip
    doc = json.loads(GOLDEN.read_text())
    assert recorded_sets(doc) == doc["machines"] and all(
        set(v) == {"cpu", "tsv_sha256"} for v in doc["machines"].values()
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
    sets = recorded_sets(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else {}
    key, label = machine()
    old = sets.get(key, {}).get("tsv_sha256", {})
    sets[key] = {"cpu": label, "tsv_sha256": found}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = GOLDEN.with_suffix(".tmp")
    doc = {"analyses": ANALYSES, "limit": LIMIT, "machines": sets}
    tmp_path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp_path, GOLDEN)
    changes = differences(old, found)
    others = [v["cpu"] for k, v in sets.items() if k != key]
    print(f"{GOLDEN}: {len(found)} TSVs for {label} ({key}); {len(changes)} changes against its set before"
          + "".join(f"\n  {c}" for c in changes)
          + (f"\nkept the sets of {others}: refresh them on those machines if outputs changed" if others else ""))  # fmt: skip


if __name__ == "__main__":
    main()
