"""Rule clark_syntax_relation_map: Clark et al.'s Table 1 relations (PTB, Stanford Dependencies) -> UD."""

from headatlas.clark.syntax import RELATION_MAP
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
write_tsv(RELATION_MAP, sm.output[0], float_format=None)
log.info("%d relation rows", len(RELATION_MAP))
write_tables_html(sm)  # the HTML page of each reported TSV
