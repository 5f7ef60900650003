"""Rule extract_attention: one model x corpus x shard into per-layer HDF5 files."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.extract import config_hash, extract, shard_slice  # noqa: E402
from headatlas.core.inputs import check_max_length  # noqa: E402
from headatlas.core.models import ModelSpec, load  # noqa: E402
from headatlas.core.parse import trees_of  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.fused import build_reducers, sample_records  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params.extraction
spec = ModelSpec.from_config(p["model"])
records = load_records(sm.input.corpus)
part = shard_slice(len(records), sm.params.shard, sm.params.n_shards)
model, tokenizer, config = load(spec, cache_dir=sm.input.model[0] if sm.input.model else None)
check_max_length(spec, config.to_dict(), f"{spec.name}'s config", p["reps"] and p["rep_position"] == "past_last")
log.info(
    "model %s on %s, corpus %s shard %d/%d: records %d..%d",
    spec.name,
    model.device,
    sm.wildcards.corpus,
    sm.params.shard,
    sm.params.n_shards,
    part.start,
    part.stop,
)
meta = {
    "corpus": sm.wildcards.corpus,
    "shard": sm.params.shard,
    "n_shards": sm.params.n_shards,
    "config_hash": config_hash(p),
}
# a fused corpus (maps: sample or none): the reducers of every analysis covering it, and the sample's records
fused = p.get("fused")
reducers = sample = corpus_records = None
if fused:
    reducers = build_reducers(fused["reducers"])
    if fused["sample"]:
        sample = sample_records(len(records), fused["sample"], fused["seed"])
    trees = list(sm.input.trees)
    corpus_records = trees_of(records, load_records(trees[0]) if trees else None)
    log.info(
        "fused: reducers %s; maps kept for %s",
        [f"{r.analysis}/{r.name}" for r in reducers],
        f"{len(sample)} sampled records of the corpus" if sample is not None else "no sequence",
    )
counts = extract(
    records[part],
    spec,
    model,
    tokenizer,
    config,
    sm.output[0],
    p["storage_dtype"],
    p["overflow"],
    part.start,
    meta,
    maps=p["maps"],
    reps=p["reps"],
    rep_position=p["rep_position"],
    reducers=reducers,
    sample=sample,
    corpus_records=corpus_records,
)
log.info("counts %s", counts.values)
