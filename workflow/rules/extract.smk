rule extract_attention:
    input:
        corpus="results/corpora/{corpus}.jsonl.gz",
        model=model_cache,
    output:
        directory("results/attention/{model}/{corpus}/shard{shard}of{nshards}"),
    params:
        extraction=extraction_params,
        shard=lambda wc: int(wc.shard),
        n_shards=lambda wc: int(wc.nshards),
    log:
        "logs/extract_attention/{model}/{corpus}/shard{shard}of{nshards}.log",
    threads: EXTRACTION["threads"]
    resources:
        mem_mb=8000,
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    conda:
        "../../envs/headatlas.yaml"
    script:
        "../../scripts/extract_attention.py"
