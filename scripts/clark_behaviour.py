"""Rule clark_behaviour: Clark et al.'s behaviour label per head (thresholds from the config)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.surface import SHARE_STATS, STATS, SurfaceSettings, behaviour_table  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.integrity import SHARE_RANGE, read_table  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
surface = read_table(sm.input[0], ["layer", "head", *STATS], ranges=dict.fromkeys(SHARE_STATS, SHARE_RANGE))
table = behaviour_table(surface, SurfaceSettings.from_config(sm.params.surface))
with atomic_path(sm.output[0]) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("labels: %s", table["label"].value_counts().to_dict())
write_tables_html(sm)  # the HTML page of each reported TSV
