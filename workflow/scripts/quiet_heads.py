"""Rule quiet_heads: the quiet-heads statistics joined to the detectors' sink heads and the zero-ablation."""

import pandas as pd

from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.quiet.analysis import QuietSettings, heads_table, summary_table
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
settings = QuietSettings.from_config(sm.params.quiet)


def table(key: str):
    """An input table, or None where the rule was not given it."""
    return pd.read_csv(sm.input[key], sep="\t") if key in sm.input.keys() else None


zero = table("zero")
heads = heads_table(table("stats"), table("detectors"), zero, settings)
summary = summary_table(heads, settings, zero)
write_tsv(heads, sm.output.heads)
write_tsv(summary, sm.output.summary)
log.info("summary:\n%s", summary.T.to_string())
write_tables_html(sm)
