"""Rule clark_syntax_relation_map: Clark et al.'s Table 1 relations (PTB, Stanford Dependencies) -> UD."""

from headatlas.clark.syntax import RELATION_MAP
from headatlas.core.html import write_tables_html
from headatlas.core.io import atomic_path
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
with atomic_path(sm.output[0]) as tmp:
    RELATION_MAP.to_csv(tmp, sep="\t", index=False)
log.info("%d relation rows", len(RELATION_MAP))
write_tables_html(sm)  # the HTML page of each reported TSV
