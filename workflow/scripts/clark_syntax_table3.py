"""Rule clark_syntax_table3: Table 3 analogue (probe UAS beside the paper's) and its figure."""

import pandas as pd

from headatlas.clark.parsing_probe import table3
from headatlas.clark.syntax_figures import plot_table3
from headatlas.core.figures import save_figure
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
model = sm.wildcards.model
uas = pd.read_csv(sm.input.uas, sep="\t")
random_uas = pd.read_csv(sm.input.random, sep="\t") if "random" in sm.input.keys() else None
t = table3(uas, random_uas, model, sm.params.random_model)
write_tsv(t, sm.output.table)
save_figure(plot_table3(t, model), sm.output.png, sm.output.svg)
log.info("table 3:\n%s", t.to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
