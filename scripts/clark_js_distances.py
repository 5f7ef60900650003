"""Rule clark_js_distances: summed Jensen-Shannon distance between every pair of heads."""

import sys
import time

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.clustering import distance_long, js_distance_matrix  # noqa: E402
from headatlas.clark.surface import SurfaceSettings  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
c = SurfaceSettings.from_config(sm.params.surface).clustering
t0 = time.time()
with AttentionStore(list(sm.input)) as store:
    d, n_seq, n_tok = js_distance_matrix(store, c.n_segments, c.smoothing, c.max_elements)
    table = distance_long(d, store.n_layers, store.n_heads, store.meta["model"], n_tok)
table["n_sequences"] = n_seq
table["n_tokens"] = n_tok
with atomic_path(sm.output[0]) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.8g")
log.info("%d heads, %d sequences, %d query tokens, %.1f s", len(d), n_seq, n_tok, time.time() - t0)
