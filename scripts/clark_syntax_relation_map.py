"""Rule clark_syntax_relation_map: Clark et al.'s Table 1 relations (PTB, Stanford Dependencies) -> UD."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.syntax import RELATION_MAP  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
with atomic_path(sm.output[0]) as tmp:
    RELATION_MAP.to_csv(tmp, sep="\t", index=False)
log.info("%d relation rows", len(RELATION_MAP))
write_tables_html(sm)  # the HTML page of each reported TSV
