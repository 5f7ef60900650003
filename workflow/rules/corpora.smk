rule prepare_corpus:
    input:
        lambda wc: corpus_paths(wc.corpus),
    output:
        "results/corpora/{corpus}.jsonl.gz",
    log:
        "logs/prepare_corpus/{corpus}.log",
    benchmark:
        "results/benchmarks/prepare_corpus/{corpus}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        spec=lambda wc: corpus_build_spec(CORPORA[wc.corpus]),
    script:
        "../scripts/prepare_corpus.py"
