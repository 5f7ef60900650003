"""Rule jomyaeng_summary: last layer / best layer / top-n of every model, with the paper's BERT-base."""

import pandas as pd

from headatlas.core.html import write_tables_html
from headatlas.core.io import atomic_path
from headatlas.core.runner import setup
from headatlas.jomyaeng.analysis import with_paper

sm = snakemake
log = setup(sm)
summary = with_paper(pd.concat([pd.read_csv(p, sep="\t") for p in sm.input], ignore_index=True))
with atomic_path(sm.output[0]) as tmp:
    summary.to_csv(tmp, sep="\t", index=False, float_format="%.4g")
log.info("%d rows", len(summary))
write_tables_html(sm)  # the HTML page of each reported TSV
