"""Rule clark_surface_stats: per-head surface statistics (Clark et al. Sec. 3) from stored maps."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.surface import SurfaceSettings, surface_table  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
with AttentionStore(list(sm.input)) as store:
    table = surface_table(store, smoothing=SurfaceSettings.from_config(sm.params.surface).smoothing)
with atomic_path(sm.output[0]) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("%d heads, %d sequences, model kind %s", len(table), len(store), store.meta.get("model_kind"))
write_tables_html(sm)  # the HTML page of each reported TSV
