"""Rule clark_js_distances: summed Jensen-Shannon distance between every pair of heads, replayed from stored
maps or loaded from a fused extraction (headatlas.core.reduce.reduce_corpus)."""

import time

from headatlas.clark.clustering import distance_long
from headatlas.clark.reducers import JSReducer
from headatlas.clark.surface import SurfaceSettings
from headatlas.core.io import write_tsv
from headatlas.core.reduce import reduce_corpus
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore

sm = snakemake
log = setup(sm)
t0 = time.time()
reducer = JSReducer.from_settings(SurfaceSettings.from_config(sm.params.surface))
result = reduce_corpus(list(sm.input), reducer)
d, n_seq, n_tok = result
with AttentionStore(list(sm.input)) as store:
    heads = reducer.heads_of(result, store.n_layers, store.n_heads)
    table = distance_long(d, store.n_layers, store.n_heads, store.meta["model"], n_tok, heads)
table["n_sequences"] = n_seq
table["n_tokens"] = n_tok
write_tsv(table, sm.output[0], float_format="%.8g")
log.info("%d heads, %d sequences, %d query tokens, %.1f s", len(d), n_seq, n_tok, time.time() - t0)
