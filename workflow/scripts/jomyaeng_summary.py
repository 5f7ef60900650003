"""Rule jomyaeng_summary: last layer / best layer / top-n of every model, with the paper's BERT-base."""

import pandas as pd

from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.jomyaeng.analysis import with_paper
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
summary = with_paper(pd.concat([pd.read_csv(p, sep="\t") for p in sm.input], ignore_index=True))
write_tsv(summary, sm.output[0], float_format="%.4g")
log.info("%d rows", len(summary))
write_tables_html(sm)  # the HTML page of each reported TSV
