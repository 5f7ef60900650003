"""Rule detectors_sinks_by_model: the share of sink heads of every model beside Gu et al.'s Table 1."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.detectors.analysis import sinks_by_model  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
table = sinks_by_model([pd.read_csv(p, sep="\t") for p in sm.input])
with atomic_path(sm.output.table) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("sink shares:\n%s", table.to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
