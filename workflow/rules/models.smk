rule cache_model:
    input:
        gguf=lambda wc: model_files(ModelSpec.from_config(MODELS[wc.model])),
    output:
        directory("results/models/gguf/{model}"),
    log:
        "logs/cache_model/{model}.log",
    benchmark:
        "results/benchmarks/cache_model/{model}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=20,
    params:
        model=lambda wc: model_source(wc.model),
    script:
        "../scripts/cache_model.py"


rule finetune_model:
    input:
        unpack(finetune_inputs),
    output:
        directory("results/models/finetuned/{model}"),
    log:
        "logs/finetune_model/{model}.log",
    benchmark:
        "results/benchmarks/finetune_model/{model}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: lambda wc: finetune_params(wc)["task"]["threads"]
    resources:
        mem_mb=model_mem_mb(8000),
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        finetune=finetune_params,
    script:
        "../scripts/finetune_model.py"


rule random_init_model:
    input:
        unpack(random_init_inputs),
    output:
        directory("results/models/random_init/{model}"),
    log:
        "logs/random_init_model/{model}.log",
    benchmark:
        "results/benchmarks/random_init_model/{model}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=model_mem_mb(4000),
        runtime=20,
    params:
        random_init=random_init_params,
    script:
        "../scripts/random_init_model.py"


rule assemble_model:
    output:
        directory("results/models/assembled/{model}"),
    log:
        "logs/assemble_model/{model}.log",
    benchmark:
        "results/benchmarks/assemble_model/{model}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=20,
    params:
        model=lambda wc: model_source(wc.model),
    script:
        "../scripts/assemble_model.py"
