"""Rule clark_syntax_heads: every head as a dependency parser, best heads and offset baselines (Clark Table 1)."""

from headatlas.clark.syntax import HeadSettings
from headatlas.clark.syntax_reducers import run_heads
from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import as_dirs as dirs
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
p = sm.params
log.info("corpus %s", p.corpus)
outputs = run_heads(
    dirs(sm.input.data_maps), load_records(sm.input.data_corpus), HeadSettings.from_config(p.heads), sm.wildcards.model
)
for key, frame in outputs.items():
    write_tsv(frame, sm.output[key])
log.info("best heads:\n%s", outputs["relations"].to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
