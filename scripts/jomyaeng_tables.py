"""Rule jomyaeng_tables: one model's per-head, per-layer, top-n and summary tables."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.jomyaeng.analysis import TopNSettings, model_tables  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
results = pd.concat([pd.read_csv(p, sep="\t") for p in sm.input], ignore_index=True)
tables = model_tables(results, TopNSettings.from_config(sm.params.top))
for key, frame in tables.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
heads = tables["heads"]
log.info(
    "model %s: %d layers x %d heads, %d tasks",
    sm.wildcards.model,
    heads["layer"].max() + 1,
    heads["head"].max() + 1,
    tables["summary"]["task"].nunique(),
)
write_tables_html(sm)  # the HTML page of each reported TSV
