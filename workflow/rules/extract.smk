# Extraction: one job per model x corpus x shard (extraction.jobs: corpus), or one per model
# (jobs: model) that extracts every corpus and shard of the model in turn, loading it once; the
# same stores either way. Snakemake cannot compute a rule's outputs from a function, so jobs: model
# defines one rule per model in a loop (its outputs: the model's shard directories, known when the
# config is read) and leaves the per-corpus rule out, so that no output has two rules.
if EXTRACTION["jobs"] == "corpus":

    rule extract_attention:
        input:
            corpus="results/corpora/{corpus}.jsonl.gz",
            model=model_cache,
            trees=lambda wc: fused_trees(wc.model, wc.corpus),
        output:
            directory("results/attention/{model}/{corpus}/shard{shard}of{nshards}"),
        log:
            "logs/extract_attention/{model}/{corpus}/shard{shard}of{nshards}.log",
        benchmark:
            "results/benchmarks/extract_attention/{model}/{corpus}/shard{shard}of{nshards}.tsv"
        # the longest jobs and the input of most others: start them as soon as their inputs exist (the greedy
        # scheduler otherwise fills the cores with short model-running jobs first and the extraction ends late)
        priority: 10
        conda:
            "../../envs/headatlas.yaml"
        threads: EXTRACTION["threads"]
        resources:
            mem_mb=model_mem_mb(8000),
            runtime=120,
            gpu=lambda wc: uses_gpu(wc.model),
        params:
            extraction=lambda wc: extraction_params(wc.model, wc.corpus),
            shard=lambda wc: int(wc.shard),
            n_shards=lambda wc: int(wc.nshards),
        script:
            "../scripts/extract_attention.py"

else:
    for _model in MODELS:
        _corpora = model_corpora(_model)
        if not _corpora:
            continue
        _rule = extract_model_rule(_model)

        rule:
            name:
                _rule
            input:
                **{f"corpus/{c}": f"results/corpora/{c}.jsonl.gz" for c in _corpora},
                **{
                    f"trees/{c}": lambda wc, m=_model, c=c: fused_trees(m, c)
                    for c in _corpora
                },
                model=lambda wc, m=_model: model_inputs(m),
            output:
                **{
                    f"{c}/{Path(d).name}": directory(d)
                    for c in _corpora
                    for d in shard_dirs(_model, c)
                },
            log:
                f"logs/extract_attention/{_model}.log",
            benchmark:
                f"results/benchmarks/{_rule}.tsv"
            priority: 10  # as rule extract_attention
            conda:
                "../../envs/headatlas.yaml"
            threads: EXTRACTION["threads"]
            resources:
                mem_mb=model_mem_mb(8000, _model),
                runtime=120 * sum(n_shards(c) for c in _corpora),
                gpu=uses_gpu(_model),
            params:
                # every corpus's params: a changed reducer setting reruns this job
                extraction=lambda wc, m=_model, cs=_corpora: {
                    c: extraction_params(m, c) for c in cs
                },
                n_shards={c: n_shards(c) for c in _corpora},
            script:
                "../scripts/extract_attention.py"
