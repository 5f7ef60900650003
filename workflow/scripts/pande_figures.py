"""Rule pande_figures: role grid, co-location, layer distribution, p-values and heat maps of one model."""

from headatlas.core.runner import setup
from headatlas.pande.analysis import figures
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
summary = figures(sm.input[0], dict(sm.output), near=sm.params.near_p)
log.info("summary %s", summary)
write_tables_html(sm)  # the HTML page of each reported TSV
