"""Rule position_stats: per head and query-position bucket, where a head looks (headatlas.position)."""

from headatlas.core.io import write_tsv
from headatlas.core.reduce import reduce_corpus
from headatlas.core.runner import setup
from headatlas.position.reducers import PositionSettings

sm = snakemake
log = setup(sm)
# results of a fused extraction, else a replay of the stored maps (the fused-reducer contract)
table = reduce_corpus(list(sm.input), PositionSettings.from_config(sm.params.position).reducer())
table.insert(1, "corpus", sm.wildcards.corpus)
write_tsv(table, sm.output[0])
log.info("%d rows (layer x head x bucket), %d query tokens", len(table), int(table["n_queries"].iloc[:1].sum()))
