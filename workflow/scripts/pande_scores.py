"""Rule pande_scores: sentence-level sieve scores of every head and role on one corpus, replayed from stored maps
or loaded from a fused extraction (headatlas.core.reduce.reduce_corpus)."""

import numpy as np

from headatlas.core.data import load_records
from headatlas.core.parse import trees_of
from headatlas.core.reduce import reduce_corpus
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore
from headatlas.pande.analysis import save_scores
from headatlas.pande.reducers import SieveReducer
from headatlas.pande.sieves import SieveSettings

sm = snakemake
log = setup(sm)
settings = SieveSettings.from_config(sm.params.sieves)
records = load_records(sm.input.corpus)
records = trees_of(records, load_records(sm.input.trees[0]) if sm.input.trees else None)
reducer = SieveReducer(settings)
result = reduce_corpus(list(sm.input.shards), reducer, records)  # replayed from the maps, or a fused extraction's
with AttentionStore(list(sm.input.shards)) as store:
    result["lengths"] = store.lengths[: len(store)]  # tokens per sequence, for the score-against-length figure
    meta = {"model": store.meta["model"], "model_kind": store.meta.get("model_kind"), "corpus": sm.wildcards.corpus}
meta["trees"] = "spacy" if sm.input.trees else "gold"
save_scores(sm.output[0], result, meta)
n = (~np.isnan(result["scores"][:, 0, 0, :])).sum(0)
log.info(
    "%s on %s: %d sequences; sentences per role %s",
    meta["model"],
    meta["corpus"],
    len(result["record_id"]),
    dict(zip(result["roles"], n.tolist())),
)
names = result["relations"] + ["all"]
scored, present = result["pair_counts"].sum(0), result["pairs_present"]
log.info(
    "dependency pairs scored / in the inputs, per relation (then the union): %s",
    {k: f"{a}/{b}" for k, a, b in zip(names, scored, present)},
)
if (scored < present).any() and meta["model_kind"] != "encoder":
    log.warning(
        "%d of %d pairs are not scored: under the causal mask the query pieces (direction %s) cannot see the key word "
        "(set analysis.pande.direction to head_to_dep or both to score them), or a word of the pair has no piece in the model input",
        present[-1] - scored[-1], present[-1], settings.direction,
    )  # fmt: skip
elif (scored < present).any():
    log.warning(
        "%d of %d pairs are not scored: a word of the pair has no piece in the model input (the tokenizer dropped it)",
        present[-1] - scored[-1], present[-1],
    )  # fmt: skip
for role, why in result["notes"].items():
    log.warning("role %s has no sentence: %s", role, why)
