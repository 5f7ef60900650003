"""Rule position_stats: per head and query-position bucket, where a head looks (headatlas.core.position)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core import reduce  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.position import PositionReducer  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params.position
reducer = PositionReducer(p["local_window"], p["edges"])
if hasattr(reduce, "reduce_corpus"):  # the fused-reducer contract: results of a fused extraction, else a replay
    table = reduce.reduce_corpus(list(sm.input), reducer)
else:
    with AttentionStore(list(sm.input)) as store:
        (table,) = reduce.replay(store, [reducer], corpus=sm.wildcards.corpus)
table.insert(1, "corpus", sm.wildcards.corpus)
with atomic_path(sm.output[0]) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("%d rows (layer x head x bucket), %d query tokens", len(table), int(table["n_queries"].iloc[:1].sum()))
