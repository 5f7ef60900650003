"""Rule pande_figures: role grid, co-location, layer distribution, p-values and heat maps of one model."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.pande.analysis import figures  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
summary = figures(sm.input[0], dict(sm.output), near=sm.params.near_p)
log.info("summary %s", summary)
write_tables_html(sm)  # the HTML page of each reported TSV
