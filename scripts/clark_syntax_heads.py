"""Rule clark_syntax_heads: every head as a dependency parser, best heads and offset baselines (Clark Table 1)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.syntax import HeadSettings, run_heads  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import as_dirs as dirs  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params
log.info("corpus %s", p.corpus)
outputs = run_heads(
    dirs(sm.input.data_maps), load_records(sm.input.data_corpus), HeadSettings.from_config(p.heads), sm.wildcards.model
)
for key, frame in outputs.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("best heads:\n%s", outputs["relations"].to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
