"""Rule jomyaeng_tables: one model's per-head, per-layer, top-n and summary tables."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.jomyaeng.analysis import head_table, summary_table  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
results = pd.concat([pd.read_csv(p, sep="\t") for p in sm.input], ignore_index=True)
heads = head_table(results)
n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
layers = results[results["kind"] == "layer"].drop(columns=["kind", "head", "n", "control_dev", "control_test", "selectivity"])
topn = results[results["kind"] == "topn"].drop(columns=["kind", "layer", "head", "control_dev", "control_test", "selectivity"])
summary = summary_table(results, n_layers, n_heads, sm.params.top_n or None)
for key, frame in (("heads", heads), ("layers", layers), ("topn", topn), ("summary", summary)):
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("model %s: %d layers x %d heads, %d tasks", sm.wildcards.model, n_layers, n_heads, summary["task"].nunique())
