include: "quiet_common.smk"


rule quiet:
    input:
        corpora=lambda wc: [
            f"results/corpora/{c}.jsonl.gz"
            for c in analysis_corpora("quiet", wc.model)
        ],
        model=model_cache,
    output:
        stats="results/quiet/{model}/stats.tsv",
        massive="results/quiet/{model}/massive.tsv",
        massive_html=report(
            "results/quiet/{model}/massive.html",
            caption="../report/quiet_massive.rst",
            category="Quiet heads",
            subcategory="{model}",
            labels={"item": "Massive activations by layer, channel and token (table)"},
        ),
        layers="results/quiet/{model}/massive_layers.tsv",
    log:
        "logs/quiet/{model}.log",
    benchmark:
        "results/benchmarks/quiet/{model}.tsv"
    priority: 5
    conda:
        "../../envs/headatlas.yaml"
    threads: QUIET["threads"]
    resources:
        mem_mb=model_mem_mb(4000),
        runtime=30,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        quiet=settings_params(QuietSettings, QUIET, *QuietSettings.rule_keys("quiet")),
        model=lambda wc: MODELS[wc.model],
        corpora=lambda wc: analysis_corpora("quiet", wc.model),
    script:
        "../scripts/quiet.py"


rule quiet_ablation:
    input:
        corpora=lambda wc: [
            f"results/corpora/{c}.jsonl.gz"
            for c in analysis_corpora("quiet", wc.model)
        ],
        model=model_cache,
    output:
        zero="results/quiet/{model}/zero_ablation.tsv",
        zero_html=report(
            "results/quiet/{model}/zero_ablation.html",
            caption="../report/quiet_zero_ablation.rst",
            category="Quiet heads",
            subcategory="{model}",
            labels={"item": "Zero-ablation of every head: loss effect and CI (table)"},
        ),
        check="results/quiet/{model}/zero_check.tsv",
    log:
        "logs/quiet_ablation/{model}.log",
    benchmark:
        "results/benchmarks/quiet_ablation/{model}.tsv"
    priority: 5
    conda:
        "../../envs/headatlas.yaml"
    threads: QUIET["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        quiet=settings_params(
            QuietSettings, QUIET, *QuietSettings.rule_keys("quiet_ablation")
        ),
        model=lambda wc: MODELS[wc.model],
        corpora=lambda wc: analysis_corpora("quiet", wc.model),
    script:
        "../scripts/quiet_ablation.py"


rule quiet_heads:
    input:
        unpack(quiet_heads_inputs),
    output:
        heads="results/quiet/{model}/heads.tsv",
        heads_html=report(
            "results/quiet/{model}/heads.html",
            caption="../report/quiet_heads.rst",
            category="Quiet heads",
            subcategory="{model}",
            labels={"item": "Positional, dormant and rigid heads (table)"},
        ),
        summary="results/quiet/{model}/summary.tsv",
        summary_html=report(
            "results/quiet/{model}/summary.html",
            caption="../report/quiet_summary.rst",
            category="Quiet heads",
            subcategory="{model}",
            labels={"item": "Quiet heads in numbers (table)"},
        ),
    log:
        "logs/quiet_heads/{model}.log",
    benchmark:
        "results/benchmarks/quiet_heads/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        quiet=settings_params(QuietSettings, QUIET),
    script:
        "../scripts/quiet_heads.py"


rule quiet_figure:
    input:
        heads="results/quiet/{model}/heads.tsv",
        layers="results/quiet/{model}/massive_layers.tsv",
    output:
        png=report(
            "results/quiet/{model}/quiet.png",
            caption="../report/quiet_figure.rst",
            category="Quiet heads",
            subcategory="{model}",
            labels={
                "item": "Positional, dormant and rigid heads, massive activations (figure)"
            },
        ),
        svg="results/quiet/{model}/quiet.svg",
    log:
        "logs/quiet_figure/{model}.log",
    benchmark:
        "results/benchmarks/quiet_figure/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/quiet_figure.py"
