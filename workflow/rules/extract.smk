rule extract_attention:
    input:
        corpus="results/corpora/{corpus}.jsonl.gz",
        model=model_cache,
        trees=fused_trees,
    output:
        directory("results/attention/{model}/{corpus}/shard{shard}of{nshards}"),
    log:
        "logs/extract_attention/{model}/{corpus}/shard{shard}of{nshards}.log",
    benchmark:
        "results/benchmarks/extract_attention/{model}/{corpus}/shard{shard}of{nshards}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: EXTRACTION["threads"]
    resources:
        mem_mb=8000,
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        extraction=extraction_params,
        shard=lambda wc: int(wc.shard),
        n_shards=lambda wc: int(wc.nshards),
    script:
        "../../scripts/extract_attention.py"
