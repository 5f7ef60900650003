"""Golden check: the tiny workflow's TSVs are byte-identical to the recorded ones.

tests/golden/tiny_outputs.json holds the sha256 of every TSV the tiny configuration writes: two random
models through every analysis of the default config's ``analysis:`` block and the atlas (``run_tiny``), one set
per kind of processor it was recorded on (``machines``: torch's kernels and the CPU attention pass round
differently on AMD and Intel processors and on other vector widths, so about a fifth of the tables differ in their
last digits between machines); a run must match one of the sets byte for byte. On a kind of processor that has no
set, a run must instead match the tables of the newest refresh (tests/golden/tiny_tables.tar.xz) up to float
rounding: the same files, lines and cells, every text cell (names, labels, decisions) identical and every number
within ``RTOL`` of its column's largest magnitude, or ``ATOL`` (:func:`beyond_rounding`); the test warns, to
record that kind's set.
The same run is shared by the slow tests that read a whole run (conftest's ``golden_results``: these
digests, and test_golden_run.py: the atlas and stability end-to-end checks, the ablation rules, the fused-vs-full
comparison, the atlas page in a browser, no clipped figure), so the suite pays for one tiny run of every analysis. A refactoring must leave the digests
unchanged. When a change of outputs is intended (a tokenizer fix, a new column), refresh it on purpose and
commit the new file with the change:

    PYTHONPATH=scripts python tests/acceptance/test_golden.py --refresh

(``--keep DIR`` runs in DIR and keeps the results, to inspect or compare them with
``python tests/tiny_workflow.py compare``.) ``--refresh`` replaces the set of this kind of processor and keeps
the others, and writes this run's tables as the reference: after an intended change of outputs, refresh on each
kind of machine CI runs on, or delete the stale sets from the file (``--only``: keep this processor's set alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]  # the tests' helpers (tiny_workflow, conftest) and golden/
REPO = TESTS.parent
GOLDEN = TESTS / "golden" / "tiny_outputs.json"
TABLES = TESTS / "golden" / "tiny_tables.tar.xz"  # the TSVs of the newest refresh (a processor kind without a set)
RTOL, ATOL = 1e-3, 1e-6  # float rounding between processors: of a column's largest magnitude, and absolute
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


def tables(results: Path) -> list[Path]:
    """Every TSV under ``results`` but the jobs' benchmark files (results/benchmarks/: timings)."""
    return [p for p in sorted(results.rglob("*.tsv")) if p.relative_to(results).parts[0] != "benchmarks"]


def digests(results: Path) -> dict[str, str]:
    """sha256 of every table (:func:`tables`) under ``results`` (relative path -> hex digest)."""
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest() for p in tables(results)}


def write_tables(results: Path, archive: Path) -> None:
    """The tables under ``results`` into ``archive`` (xz tar, by relative path; no times or owners)."""
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for p in tables(results):
            info = tar.gettarinfo(p, str(p.relative_to(results)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with p.open("rb") as f:
                tar.addfile(info, f)
    os.replace(tmp, archive)


def close_table(recorded: str, now: str) -> str | None:
    """Why a table differs from its reference beyond float rounding, or None: the same lines and cells, every
    cell that is not a number identical, every number within ``ATOL + RTOL * (its column's largest magnitude in
    the reference)`` (a statistic near 0, such as a t statistic of an effect at rounding level, moves by more
    than its own size)."""
    a, b = [x.split("\t") for x in recorded.splitlines()], [x.split("\t") for x in now.splitlines()]
    if len(a) != len(b):
        return f"{len(b)} lines, the reference {len(a)}"
    scale: dict[int, float] = {}
    for row in a:
        for col, u in enumerate(row):
            try:
                x = abs(float(u))
            except ValueError:
                continue
            if x == x and x != float("inf"):
                scale[col] = max(scale.get(col, 0.0), x)
    for line, (x, y) in enumerate(zip(a, b), 1):
        if len(x) != len(y):
            return f"line {line}: {len(y)} cells, the reference {len(x)}"
        for col, (u, v) in enumerate(zip(x, y)):
            if u == v:
                continue
            try:
                fu, fv = float(u), float(v)
            except ValueError:
                return f"line {line}, column {col + 1}: {v!r}, the reference {u!r}"
            if not abs(fu - fv) <= ATOL + RTOL * scale.get(col, 0.0):
                return f"line {line}, column {col + 1}: {v}, the reference {u}"
    return None


def beyond_rounding(results: Path, archive: Path = TABLES) -> list[str]:
    """The tables under ``results`` that differ from ``archive``'s beyond float rounding (:func:`close_table`),
    and those only one of them has."""
    with tarfile.open(archive, "r:xz") as tar:
        ref = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    now = {str(p.relative_to(results)): p for p in tables(results)}
    out = [f"missing now: {k}" for k in sorted(ref.keys() - now.keys())]
    out += [f"new: {k}" for k in sorted(now.keys() - ref.keys())]
    for k in sorted(ref.keys() & now.keys()):
        why = close_table(ref[k], now[k].read_text())
        if why:
            out.append(f"{k}: {why}")
    return out


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
    if key not in sets and TABLES.exists():  # no set for this kind of processor: the reference, up to rounding
        far = beyond_rounding(golden_results)
        assert not far, (
            f"no digest set of {GOLDEN.name} for {label}, and the tables differ from {TABLES.name} beyond float "
            f"rounding (rtol {RTOL}, atol {ATOL}):\n" + "\n".join(far)
        )
        warnings.warn(f"no digest set of {GOLDEN.name} for {label}: its tables match {TABLES.name} within float "
                      "rounding; record its set with tests/acceptance/test_golden.py --refresh", stacklevel=1)  # fmt: skip
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


def test_tables_close_up_to_rounding(tmp_path):
    """A processor kind without a digest set: numbers may move by float rounding, nothing else may."""
    ref = "model\thead\tmean\tp\tsignificant\nm\t0\t0.0177101\t2.3e-08\tTrue\n"
    assert close_table(ref, ref.replace("0.0177101", "0.0177102").replace("2.3e-08", "2.5e-08")) is None
    assert close_table(ref, ref.replace("0.0177101", "0.0178")) == "line 2, column 3: 0.0178, the reference 0.0177101"
    two = ref + "m\t1\t20.0\t0.5\tFalse\n"  # the column's scale: 20, so 0.0177 may move by 0.02
    assert close_table(two, two.replace("0.0177101", "0.0377")) is None
    assert close_table(two, two.replace("0.0177101", "0.0378")) == "line 2, column 3: 0.0378, the reference 0.0177101"
    assert close_table(ref, ref.replace("True", "False")) == "line 2, column 5: 'False', the reference 'True'"
    assert close_table(ref, ref + "m\t1\t0.5\t1\tFalse\n") == "3 lines, the reference 2"
    assert close_table(ref, ref.replace("\tTrue", "")) == "line 2: 4 cells, the reference 5"
    results = tmp_path / "results"
    (results / "a").mkdir(parents=True)
    (results / "benchmarks").mkdir()
    (results / "a" / "t.tsv").write_text(ref)
    (results / "benchmarks" / "job.tsv").write_text("s\n1.0\n")  # timings: never compared
    write_tables(results, tmp_path / "ref.tar.xz")
    assert beyond_rounding(results, tmp_path / "ref.tar.xz") == []
    (results / "a" / "t.tsv").write_text(ref.replace("True", "False"))
    (results / "a" / "u.tsv").write_text(ref)
    assert beyond_rounding(results, tmp_path / "ref.tar.xz") == [
        "new: a/u.tsv", "a/t.tsv: line 2, column 5: 'False', the reference 'True'"]  # fmt: skip


def test_differences_name_every_kind_of_change():
    assert differences({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["new: c", "changed: b"]
    assert differences({"a": "1"}, {}) == ["missing now: a"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="refresh tests/golden/tiny_outputs.json from a fresh tiny run")
    parser.add_argument("--refresh", action="store_true", required=True)
    parser.add_argument("--keep", help="run in this directory and keep it (default: a temporary one)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--only", action="store_true", help="drop the other processors' sets (stale after a change)")
    args = parser.parse_args(argv)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep).resolve() if args.keep else Path(tmp)
        results = run_tiny(out, args.cores)
        found = digests(results)
        write_tables(results, TABLES)
    sets = recorded_sets(json.loads(GOLDEN.read_text())) if GOLDEN.exists() and not args.only else {}
    key, label = machine()
    old = sets.get(key, {}).get("tsv_sha256", {})
    sets[key] = {"cpu": label, "tsv_sha256": found}
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
