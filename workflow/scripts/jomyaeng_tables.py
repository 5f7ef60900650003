"""Rule jomyaeng_tables: one model's per-head, per-layer, top-n and summary tables."""

import pandas as pd

from headatlas.core.io import head_shape, write_tsv
from headatlas.core.runner import setup
from headatlas.jomyaeng.analysis import TopNSettings, model_tables
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
results = pd.concat([pd.read_csv(p, sep="\t") for p in sm.input], ignore_index=True)
tables = model_tables(results, TopNSettings.from_config(sm.params.top))
for key, frame in tables.items():
    write_tsv(frame, sm.output[key])
heads = tables["heads"]
log.info(
    "model %s: %d layers x %d heads, %d tasks",
    sm.wildcards.model,
    *head_shape(heads),
    tables["summary"]["task"].nunique(),
)
write_tables_html(sm)  # the HTML page of each reported TSV
