include: "icl_common.smk"


rule icl_heads:
    input:
        unpack(icl_inputs),
    output:
        tasks="results/icl/{model}/tasks.tsv",
        tasks_html=report(
            "results/icl/{model}/tasks.html",
            caption="../report/icl_tasks.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={"item": "ICL tasks: pairs and 10-shot accuracy (table)"},
        ),
        heads="results/icl/{model}/fv_heads.tsv",
        heads_html=report(
            "results/icl/{model}/fv_heads.html",
            caption="../report/icl_heads.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={"item": "Function-vector heads: AIE of every head (table)"},
        ),
        check="results/icl/{model}/check.tsv",
        check_html=report(
            "results/icl/{model}/check.html",
            caption="../report/icl_check.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={"item": "Attribution patching vs exact patching (table)"},
        ),
    log:
        "logs/icl_heads/{model}.log",
    benchmark:
        "results/benchmarks/icl_heads/{model}.tsv"
    priority: 5  # a long model-running job
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        icl=ICL_SETTINGS,
    script:
        "../scripts/icl_heads.py"


rule icl_figure:
    input:
        unpack(icl_figure_inputs),
    output:
        png=report(
            "results/icl/{model}/fv_heads.png",
            caption="../report/icl_figure.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={"item": "FV AIE and induction score per head (figure)"},
        ),
        svg="results/icl/{model}/fv_heads.svg",
    log:
        "logs/icl_figure/{model}.log",
    benchmark:
        "results/benchmarks/icl_figure/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        title=lambda wc: wc.model,
    script:
        "../scripts/icl_figure.py"


rule icl_agreement:
    input:
        heads="results/icl/{model}/fv_heads.tsv",
        atlas="results/atlas/{model}/atlas.tsv",
    output:
        table="results/icl/{model}/agreement.tsv",
        html=report(
            "results/icl/{model}/agreement.html",
            caption="../report/icl_agreement.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={
                "item": "FV heads against induction, previous-token, sink, retrieval heads and ablation (table)"
            },
        ),
    log:
        "logs/icl_agreement/{model}.log",
    benchmark:
        "results/benchmarks/icl_agreement/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        top_k=ICL["top_k"],
        bootstrap=ICL["bootstrap"],
        seed=ICL["seed"],
    script:
        "../scripts/icl_agreement.py"


rule icl_exclusion:
    input:
        unpack(icl_exclusion_inputs),
    output:
        table="results/icl/{model}/exclusion.tsv",
        html=report(
            "results/icl/{model}/exclusion.html",
            caption="../report/icl_exclusion.rst",
            category="ICL heads",
            subcategory="{model}",
            labels={
                "item": "Exclusion test: FV heads vs induction heads, ablated against matched random heads (table)"
            },
        ),
    log:
        "logs/icl_exclusion/{model}.log",
    benchmark:
        "results/benchmarks/icl_exclusion/{model}.tsv"
    priority: 5  # a model-running job
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=model_mem_mb(4000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        icl=ICL_SETTINGS,
        exclusion=ICL_EXCLUSION,
    script:
        "../scripts/icl_exclusion.py"
