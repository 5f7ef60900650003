"""Rule clark_surface_stats: per-head surface statistics (Clark et al. Sec. 3), replayed from stored maps
or loaded from a fused extraction (headatlas.core.reduce.reduce_corpus)."""

from headatlas.clark.reducers import SurfaceReducer
from headatlas.clark.surface import SHARE_STATS, SurfaceSettings
from headatlas.core.integrity import SHARE_RANGE, check_table
from headatlas.core.io import write_tsv
from headatlas.core.reduce import reduce_corpus
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
reducer = SurfaceReducer.from_settings(SurfaceSettings.from_config(sm.params.surface))
table = reduce_corpus(list(sm.input), reducer)
check_table(sm.output[0], table, ranges=dict.fromkeys(SHARE_STATS, SHARE_RANGE))  # never written out of range
write_tsv(table, sm.output[0])
log.info("%d heads, %d sequences, model kind %s", len(table), table["n_sequences"].iloc[0], table["model_kind"].iloc[0])
write_tables_html(sm)  # the HTML page of each reported TSV
