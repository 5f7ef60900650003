rule cache_model:
    output:
        directory("results/models/{model}"),
    params:
        model=lambda wc: MODELS[wc.model],
    log:
        "logs/cache_model/{model}.log",
    threads: 1
    resources:
        mem_mb=6000,
        runtime=20,
    conda:
        "../../envs/headatlas.yaml"
    script:
        "../../scripts/cache_model.py"
