"""Rule clark_behaviour: Clark et al.'s behaviour label per head (thresholds from the config)."""

from headatlas.clark.surface import SHARE_STATS, STATS, SurfaceSettings, behaviour_table
from headatlas.core.integrity import SHARE_RANGE, read_table
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
surface = read_table(sm.input[0], ["layer", "head", *STATS], ranges=dict.fromkeys(SHARE_STATS, SHARE_RANGE))
table = behaviour_table(surface, SurfaceSettings.from_config(sm.params.surface))
write_tsv(table, sm.output[0])
log.info("labels: %s", table["label"].value_counts().to_dict())
write_tables_html(sm)  # the HTML page of each reported TSV
