"""Rule position_stats: per head and query-position bucket, where a head looks (headatlas.position)."""

from headatlas.core import reduce
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore
from headatlas.position.reducers import PositionReducer

sm = snakemake
log = setup(sm)
p = sm.params.position
reducer = PositionReducer(p["local_window"], p["edges"])
if hasattr(reduce, "reduce_corpus"):  # the fused-reducer contract: results of a fused extraction, else a replay
    table = reduce.reduce_corpus(list(sm.input), reducer)
else:
    with AttentionStore(list(sm.input)) as store:
        (table,) = reduce.replay(store, [reducer], corpus=sm.wildcards.corpus)
table.insert(1, "corpus", sm.wildcards.corpus)
write_tsv(table, sm.output[0])
log.info("%d rows (layer x head x bucket), %d query tokens", len(table), int(table["n_queries"].iloc[:1].sum()))
