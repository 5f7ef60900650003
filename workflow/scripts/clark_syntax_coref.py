"""Rule clark_syntax_coref: antecedent selection accuracy of every head and of the baselines (Clark Table 2)."""

from headatlas.clark.coref import CorefSettings
from headatlas.clark.syntax_reducers import run_coref
from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import as_dirs as dirs
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
p = sm.params
splits = {split: (dirs(sm.input[f"{split}_maps"]), load_records(sm.input[f"{split}_corpus"])) for split in p.splits}
outputs = run_coref(splits, CorefSettings.from_config(p.coref), sm.wildcards.model)
for key, frame in outputs.items():
    write_tsv(frame, sm.output[key])
write_tables_html(sm)  # the HTML page of each reported TSV
