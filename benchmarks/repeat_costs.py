"""How repeatable is a job's measured cost? The cost records of the same jobs measured twice: a run's ``logs/``
copied aside, some of its jobs run again (``snakemake TARGETS --forcerun RULES --allowed-rules RULES``, the same
code, config and inputs, one job at a time), and the two records of each job compared.

Run from the repository root::

    cp -r RUN/logs BEFORE
    snakemake TARGETS --cores 1 --configfile CONFIG --directory RUN --forcerun RULES --allowed-rules RULES
    python benchmarks/repeat_costs.py BEFORE RUN/logs --out benchmarks/results_repeat_costs.json

Per job rerun (its record's ``finished`` time changed): CPU-seconds, wall seconds and peak RSS of both
measurements and the ratio of the CPU-seconds. A cost model fitted on one measurement cannot predict the other
closer than that ratio.

``--rows ROWS --rows-out OUT`` writes a cost model's fit data (``plan fit --save-rows``) with each rerun job's
CPU-seconds replaced by the rerun's (a row matches by rule, wildcards and the first measurement; the first is kept
as ``cpu_s_before``), so that a fit can use the repeat measurement where the first was taken on a loaded machine.
``--jobs FILE`` (repeatable) takes the rerun jobs from comparisons written before (``--out``) instead of two logs
directories.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def repeated(before: Path, after: Path) -> list[dict]:
    out = []
    for path in sorted(after.rglob("*.cost.json")):
        old = before / path.relative_to(after)
        if not old.is_file():
            continue
        a, b = json.loads(old.read_text()), json.loads(path.read_text())
        if a.get("finished") == b.get("finished") or not a.get("cpu_s"):
            continue  # not rerun
        out.append({"rule": b["rule"], "wildcards": b.get("wildcards", {}),
                    "cpu_s": [a["cpu_s"], b["cpu_s"]], "wall_s": [a["wall_s"], b["wall_s"]],
                    "peak_rss_gb": [round(a["peak_rss_bytes"] / 1e9, 2), round(b["peak_rss_bytes"] / 1e9, 2)],
                    "finished": [a.get("finished"), b.get("finished")],
                    "cpu_ratio": round(b["cpu_s"] / a["cpu_s"], 3)})  # fmt: skip
    return out


def remeasured_rows(rows: list[dict], jobs: list[dict]) -> tuple[list[dict], int]:
    """``rows`` (the fit's data) with the CPU-seconds of the jobs of ``repeated`` replaced by their second
    measurement, and how many rows were replaced."""

    def key(rule, wildcards, cpu_s):
        return rule, json.dumps({k: str(v) for k, v in wildcards.items()}, sort_keys=True), round(float(cpu_s), 3)

    second = {key(j["rule"], j["wildcards"], j["cpu_s"][0]): j["cpu_s"][1] for j in jobs}
    out, n = [], 0
    for r in rows:
        wildcards = dict(r["wildcards"], **({"model": r["model"]} if r.get("model") else {}))
        new = second.get(key(r["rule"], wildcards, r["measured"]["cpu_s"]))
        if new is not None:
            first = r["measured"].get("cpu_s_before", r["measured"]["cpu_s"])  # a job measured three times: the first
            r = dict(r, measured=dict(r["measured"], cpu_s=new, cpu_s_before=first))
            n += 1
        out.append(r)
    return out, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path, nargs="?", help="the logs/ directory as it was before the rerun")
    ap.add_argument("after", type=Path, nargs="?", help="the run's logs/ directory after it")
    ap.add_argument("--jobs", type=Path, action="append", default=[], help="a comparison written before (--out)")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON")
    ap.add_argument("--rows", type=Path, help="a cost model's fit data (plan fit --save-rows) to update")
    ap.add_argument("--rows-out", type=Path, help="where the updated fit data goes (with --rows)")
    args = ap.parse_args(argv)
    if bool(args.rows) != bool(args.rows_out):
        ap.error("--rows and --rows-out go together")
    if bool(args.before) != bool(args.after) or bool(args.before) == bool(args.jobs):
        ap.error("give either BEFORE and AFTER or --jobs")
    if args.out and args.jobs:
        ap.error("--out writes the comparison of BEFORE and AFTER")
    jobs = repeated(args.before, args.after) if args.before else []
    for path in args.jobs:
        jobs += json.loads(path.read_text())["jobs"]
    for j in jobs:
        name = " ".join([j["rule"], *(f"{k}={v}" for k, v in j["wildcards"].items() if k in ("model", "corpus"))])
        print(f"{name:<45} CPU-s {j['cpu_s'][0]:8.1f} -> {j['cpu_s'][1]:8.1f}  x{j['cpu_ratio']:.2f}")
    if args.out:
        args.out.write_text(json.dumps({"jobs": jobs}, indent=1) + "\n")
    if args.rows:
        rows, n = remeasured_rows(json.loads(args.rows.read_text()), jobs)
        args.rows_out.write_text(json.dumps(rows, indent=0) + "\n")
        print(f"{args.rows_out}: {n} of {len(rows)} rows re-measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
