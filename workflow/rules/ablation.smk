include: "ablation_common.smk"


rule ablation_exact:
    input:
        unpack(ablation_inputs),
    output:
        "results/ablation/{model}/exact/{part}.npz",
    log:
        "logs/ablation_exact/{model}/{part}.log",
    benchmark:
        "results/benchmarks/ablation_exact/{model}/{part}.tsv"
    wildcard_constraints:
        part=r"\d+",
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: ABLATION["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        task=ablation_task,
        ablation=ABLATION_SETTINGS,
        jobs=ABLATION["exact_jobs"],
        part=lambda wc: int(wc.part),
    script:
        "../scripts/ablation_exact.py"


rule ablation_heads:
    input:
        unpack(ablation_inputs),
        exact=lambda wc: [
            f"results/ablation/{wc.model}/exact/{p}.npz"
            for p in range(ABLATION["exact_jobs"])
        ],
    output:
        heads="results/ablation/{model}/heads.tsv",
        heads_html=report(
            "results/ablation/{model}/heads.html",
            caption="../report/ablation_heads.rst",
            category="Ablations",
            subcategory="{model}",
            labels={"item": "Head ablation effects (table)"},
        ),
        check="results/ablation/{model}/check.tsv",
        check_html=report(
            "results/ablation/{model}/check.html",
            caption="../report/ablation_check.rst",
            category="Ablations",
            subcategory="{model}",
            labels={"item": "Estimates vs exact ablation, per layer (table)"},
        ),
    log:
        "logs/ablation_heads/{model}.log",
    benchmark:
        "results/benchmarks/ablation_heads/{model}.tsv"
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: ABLATION["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        task=ablation_task,
        ablation=ABLATION_SETTINGS,
    script:
        "../scripts/ablation_heads.py"


rule ablation_roles:
    input:
        unpack(ablation_role_inputs),
    output:
        roles="results/ablation/{model}/roles.tsv",
        roles_html=report(
            "results/ablation/{model}/roles.html",
            caption="../report/ablation_roles.rst",
            category="Ablations",
            subcategory="{model}",
            labels={"item": "Role ablation vs random heads (table)"},
        ),
        pruning="results/ablation/{model}/pruning.tsv",
        removable="results/ablation/{model}/removable.tsv",
        figure=report(
            "results/ablation/{model}/pruning.png",
            caption="../report/ablation_pruning.rst",
            category="Ablations",
            subcategory="{model}",
            labels={"item": "Pruning curves (figure)"},
        ),
        svg="results/ablation/{model}/pruning.svg",
    log:
        "logs/ablation_roles/{model}.log",
    benchmark:
        "results/benchmarks/ablation_roles/{model}.tsv"
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: ABLATION["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        task=ablation_task,
        ablation=ABLATION_SETTINGS,
    script:
        "../scripts/ablation_roles.py"
