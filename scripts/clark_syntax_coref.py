"""Rule clark_syntax_coref: antecedent selection accuracy of every head and of the baselines (Clark Table 2)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.coref import CorefSettings, run_coref  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import as_dirs as dirs  # noqa: E402
from headatlas.core.runner import setup

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params
splits = {split: (dirs(sm.input[f"{split}_maps"]), load_records(sm.input[f"{split}_corpus"])) for split in p.splits}
outputs = run_coref(splits, CorefSettings.from_config(p.coref), sm.wildcards.model)
for key, frame in outputs.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
write_tables_html(sm)  # the HTML page of each reported TSV
