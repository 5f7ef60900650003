"""Rule extract_attention: one model x corpus x shard into per-layer HDF5 files; or (extraction.jobs: model)
every corpus and shard of one model in turn, the model loaded once (the same stores either way)."""

from headatlas.core.data import load_records
from headatlas.core.integrity import check_unk_share
from headatlas.core.models import load, resolve
from headatlas.core.runner import as_dirs, model_job, setup
from headatlas.fused import extract_shard, extraction_spec

sm = snakemake
log = setup(sm)


def jobs():
    """(corpus, corpus file, trees, params, shard, n_shards, output) of every store this job writes."""
    if "corpus" in sm.wildcards.keys():
        p = sm.params
        yield sm.wildcards.corpus, sm.input.corpus, sm.input.trees, p.extraction, p.shard, p.n_shards, sm.output[0]
        return
    for corpus, p in sm.params.extraction.items():
        n = sm.params.n_shards[corpus]
        for shard in range(n):
            out = sm.output[f"{corpus}/shard{shard}of{n}"]
            yield corpus, sm.input[f"corpus/{corpus}"], sm.input[f"trees/{corpus}"], p, shard, n, out


todo = list(jobs())
# the first corpus's spec loads the model (a corpus that sets max_length is checked before the weights load);
# every corpus's max_length against the loaded config before any store is written
spec, cache_dir, device = model_job(sm, todo[0][3]["model"])
model, tokenizer, config = load(spec, cache_dir=cache_dir, device=device)
for job in todo:
    extraction_spec(job[3], config)
loaded = records = None
for corpus, path, trees, p, shard, n, out in todo:
    if path != loaded:  # one corpus in memory at a time
        loaded, records = path, load_records(path)
        share = check_unk_share(records, tokenizer, f"model {spec.name!r} ({resolve(spec, cache_dir)[0]}) on {path}",
                                sm.config["extraction"]["max_unk_share"])  # fmt: skip
        log.info("corpus %s: %.3f%% of its tokens are the tokenizer's unknown token", corpus, 100 * share)
    extract_shard(records, p, corpus, shard, n, out, model, tokenizer, config, as_dirs(trees))
