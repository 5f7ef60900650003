rule cache_model:
    output:
        directory("results/models/gguf/{model}"),
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


rule finetune_model:
    input:
        unpack(finetune_inputs),
    output:
        directory("results/models/finetuned/{model}"),
    params:
        finetune=finetune_params,
    log:
        "logs/finetune_model/{model}.log",
    threads: lambda wc: finetune_params(wc)["task"]["threads"]
    resources:
        mem_mb=8000,
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    conda:
        "../../envs/headatlas.yaml"
    script:
        "../../scripts/finetune_model.py"
