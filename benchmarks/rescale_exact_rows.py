"""Bring stored cost rows (``plan fit --save-rows``) measured before the cost model counted an exact pass by the
layers it runs to the current features.

An exact single-head ablation or patching (``Evaluation.exact``) expands its batch inside the model at the head's
layer, so the layers before it run once per pass of several heads, not once per head: per head and token it costs
the body's weights times (L + 1) / 2L (heads spread evenly over the layers) plus the logits, not the whole body
plus the logits. The rows' ``abl`` and ``abl_other`` (rules ablation_exact, quiet_ablation: body and logits;
icl_heads: body, only the last position's logits) are multiplied by the ratio of the two, which depends on the
model's shape only; every other feature is unchanged. A row already rescaled (``abl_exact_pass``) is left as it
is, so running it twice changes nothing.

Run from the repository root (``--configfile``: a config that names every model of the rows)::

    python benchmarks/rescale_exact_rows.py benchmarks/cost_rows.json benchmarks/cost_rows_pilot_qwen15.json \\
        --configfile config/scale.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from headatlas.core.plan import Features, load_config  # noqa: E402

WITH_LOGITS = ("ablation_exact", "quiet_ablation")
BODY_ONLY = ("icl_heads",)


def ratio(feats: Features, model: str, rule: str) -> float:
    """The current per-token weights of one exact pass over those the row was measured with."""
    s = feats.shape(model)
    if rule in BODY_ONLY:
        return feats._exact_body(s) / s.body_params
    logits = s.vocab * s.d_model
    return feats._exact_pass(s) / (s.body_params + logits)


def rescale(rows: list[dict], feats: Features) -> int:
    n = 0
    for r in rows:
        if r["rule"] not in WITH_LOGITS + BODY_ONLY or r.get("abl_exact_pass") or not r["features"].get("abl"):
            continue
        k = ratio(feats, r["model"], r["rule"])
        for term in ("abl", "abl_other"):
            if term in r["features"]:
                r["features"][term] *= k
        r["abl_exact_pass"] = True
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", help="files written by plan fit --save-rows (rewritten in place)")
    ap.add_argument("--configfile", default="config/scale.yaml")
    args = ap.parse_args(argv)
    feats = Features(load_config(args.configfile))
    for path in args.rows:
        rows = json.loads(Path(path).read_text())
        n = rescale(rows, feats)
        Path(path).write_text(json.dumps(rows, indent=0) + "\n")
        print(f"{path}: {n} rows rescaled")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
