"""Compare every table of two workflow runs: the default (fused, maps: sample/none) against a store-everything run
(maps: full everywhere), as issue 13 asks ("every table of the default run equal to the store-everything run's within
documented tolerances").

    python benchmarks/compare_runs.py RUN_A RUN_B [--out benchmarks/results_compare_runs.json]

For every TSV under RUN_A/results that RUN_B also has (benchmark timings excluded): rows and columns must match;
text cells must be equal; numeric cells are compared by absolute and relative difference. Printed: one line per
table with the largest differences, then a summary by kind of column. Exit status 1 when a table is missing, has other
rows/columns or other text.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def read_tsv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return (rows[0], rows[1:]) if rows else ([], [])


def as_float(s: str):
    try:
        return float(s)
    except ValueError:
        return None


def compare_table(a: Path, b: Path) -> dict:
    ha, ra = read_tsv(a)
    hb, rb = read_tsv(b)
    out = {"rows": len(ra), "columns": {}, "text_diff": 0, "first_text_diff": None}
    if ha != hb or len(ra) != len(rb):
        out["shape"] = f"header or row count differs: {len(ha)} x {len(ra)} vs {len(hb)} x {len(rb)}"
        return out
    for i, (x, y) in enumerate(zip(ra, rb)):
        for col, u, v in zip(ha, x, y):
            if u == v:
                continue
            fu, fv = as_float(u), as_float(v)
            if fu is None or fv is None or math.isnan(fu) != math.isnan(fv):
                out["text_diff"] += 1
                out["first_text_diff"] = out["first_text_diff"] or f"row {i + 2}, {col}: {u!r} vs {v!r}"
                continue
            if math.isnan(fu):
                continue
            d = abs(fu - fv)
            rel = d / max(abs(fu), abs(fv), 1e-300)
            c = out["columns"].setdefault(col, {"cells": 0, "max_abs": 0.0, "max_rel": 0.0})
            c["cells"] += 1
            c["max_abs"] = max(c["max_abs"], d)
            c["max_rel"] = max(c["max_rel"], rel)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    base_a, base_b = args.run_a / "results", args.run_b / "results"
    tables = sorted(p.relative_to(base_a) for p in base_a.rglob("*.tsv") if "benchmarks" not in p.parts)
    report, bad = {}, 0
    for rel in tables:
        if not (base_b / rel).exists():
            report[str(rel)] = {"missing": True}
            print(f"{rel}: missing in {args.run_b}")
            bad += 1
            continue
        r = compare_table(base_a / rel, base_b / rel)
        report[str(rel)] = r
        if "shape" in r or r["text_diff"]:
            bad += 1
            print(
                f"{rel}: {r.get('shape') or str(r['text_diff']) + ' text cells differ, first ' + r['first_text_diff']}"
            )
        elif r["columns"]:
            worst = max(r["columns"].items(), key=lambda kv: kv[1]["max_abs"])
            print(
                f"{rel}: {sum(c['cells'] for c in r['columns'].values())} numeric cells differ; "
                f"largest in {worst[0]!r}: {worst[1]['max_abs']:.3g} abs, {worst[1]['max_rel']:.3g} rel"
            )
    same = sum(
        1
        for r in report.values()
        if not r.get("missing") and "shape" not in r and not r["text_diff"] and not r["columns"]
    )
    print(
        f"{len(tables)} tables: {same} identical, {len(tables) - same - bad} numerically different only, {bad} differ in shape or text"
    )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
