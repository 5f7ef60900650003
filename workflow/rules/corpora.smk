rule prepare_corpus:
    input:
        lambda wc: corpus_paths(wc.corpus),
    output:
        "results/corpora/{corpus}.jsonl.gz",
    params:
        spec=lambda wc: CORPORA[wc.corpus],
    log:
        "logs/prepare_corpus/{corpus}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        "../../envs/headatlas.yaml"
    script:
        "../../scripts/prepare_corpus.py"
