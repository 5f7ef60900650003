"""Rule clark_examples: line diagrams of the strongest head of each behaviour (Clark et al. Fig. 1)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from headatlas.clark.figures import display_token, fig1_examples  # noqa: E402
from headatlas.clark.surface import best_heads, example_index, punct_mask  # noqa: E402
from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
best = best_heads(pd.read_csv(sm.input.behaviour, sep="\t"))
with AttentionStore(list(sm.input.maps)) as store:
    # prefer a sequence with a period or comma, so every behaviour has something to show
    has_punct = np.add.reduceat(punct_mask(store.piece, store.special).astype(int), store.token_offsets[:-1]) > 0
    k = example_index(store.lengths, sm.params.n_tokens, has_punct)
    maps = {(r.layer, r.head): store.maps(r.layer, k, r.head) for r in best.itertuples()}
    tokens = [display_token(p) for p in store.tokens(k)["piece"]]
    best = best.assign(sequence=k, record_id=store.record_id[k], n_tokens=len(tokens))
with atomic_path(sm.output.table) as tmp:
    best.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
save_figure(
    fig1_examples(best, maps, tokens, sm.wildcards.model, sm.wildcards.corpus, sm.params.min_weight),
    sm.output.png,
    sm.output.svg,
)
log.info("sequence %d (%d tokens), heads %s", k, len(tokens), best[["behaviour", "layer", "head"]].values.tolist())
