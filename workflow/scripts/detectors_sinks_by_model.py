"""Rule detectors_sinks_by_model: the share of sink heads of every model beside Gu et al.'s Table 1."""

import pandas as pd

from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.detectors.analysis import sinks_by_model
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
table = sinks_by_model([pd.read_csv(p, sep="\t") for p in sm.input])
write_tsv(table, sm.output.table)
log.info("sink shares:\n%s", table.to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
