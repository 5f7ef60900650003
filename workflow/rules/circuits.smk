include: "circuits_common.smk"


rule circuits_weights:
    input:
        model=model_cache,
    output:
        pairs="results/circuits/{model}/composition.tsv",
        summary="results/circuits/{model}/composition_summary.tsv",
        summary_html=report(
            "results/circuits/{model}/composition_summary.html",
            caption="../report/circuits_composition_summary.rst",
            category="Circuits",
            subcategory="{model}",
            labels={"item": "Composition scores beside their nulls (table)"},
        ),
        heads="results/circuits/{model}/weights_heads.tsv",
        tokens="results/circuits/{model}/tokens.tsv",
    log:
        "logs/circuits_weights/{model}.log",
    benchmark:
        "results/benchmarks/circuits_weights/{model}.tsv"
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: CIRCUITS["threads"]
    resources:
        mem_mb=model_mem_mb(4000),
        runtime=20,
    params:
        circuits=settings_params(CircuitSettings, CIRCUITS),
        model=lambda wc: MODELS[wc.model],
    script:
        "../scripts/circuits_weights.py"


rule circuits_causal:
    input:
        unpack(circuits_causal_inputs),
    output:
        summary="results/circuits/{model}/induction.tsv",
        summary_html=report(
            "results/circuits/{model}/induction.html",
            caption="../report/circuits_induction.rst",
            category="Circuits",
            subcategory="{model}",
            labels={"item": "Do induction heads need previous-token heads? (table)"},
        ),
        per_head="results/circuits/{model}/induction_heads.tsv",
        runs="results/circuits/{model}/needle_runs.tsv",
        heads="results/circuits/{model}/long_heads.tsv",
        bins="results/circuits/{model}/retrieval_bins.tsv",
        bins_html=report(
            "results/circuits/{model}/retrieval_bins.html",
            caption="../report/circuits_retrieval_bins.rst",
            category="Circuits",
            subcategory="{model}",
            labels={"item": "Retrieval heads beside Wu et al. (table)"},
        ),
        sets="results/circuits/{model}/long_sets.tsv",
        window="results/circuits/{model}/window_check.tsv",
    log:
        "logs/circuits_causal/{model}.log",
    benchmark:
        "results/benchmarks/circuits_causal/{model}.tsv"
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: CIRCUITS["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        circuits=settings_params(CircuitSettings, CIRCUITS),
        induction=settings_params(InductionSettings, CIRCUITS["induction"]),
        induction_active=CIRCUITS["induction"]["activate"],
        long=settings_params(LongSettings, CIRCUITS["long"]),
        long_active=CIRCUITS["long"]["activate"],
        detectors=lambda wc: settings_params(
            DetectorSettings, ANALYSES["detectors"], *CIRCUIT_DETECTOR_KEYS
        ),
        model=lambda wc: MODELS[wc.model],
    script:
        "../scripts/circuits_causal.py"


rule circuits_model:
    input:
        unpack(circuits_model_inputs),
    output:
        heads="results/circuits/{model}/heads.tsv",
        heads_html=report(
            "results/circuits/{model}/heads.html",
            caption="../report/circuits_heads.rst",
            category="Circuits",
            subcategory="{model}",
            labels={"item": "Circuit scores per head (table)"},
        ),
        agreement="results/circuits/{model}/agreement.tsv",
        agreement_html=report(
            "results/circuits/{model}/agreement.html",
            caption="../report/circuits_agreement.rst",
            category="Circuits",
            subcategory="{model}",
            labels={"item": "Agreement between detectors (table)"},
        ),
        png=report(
            "results/circuits/{model}/composition.png",
            caption="../report/circuits_composition.rst",
            category="Circuits",
            subcategory="{model}",
            labels={
                "item": "Strongest composition edges between labelled heads (figure)"
            },
        ),
        svg="results/circuits/{model}/composition.svg",
    log:
        "logs/circuits_model/{model}.log",
    benchmark:
        "results/benchmarks/circuits_model/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        circuits=settings_params(CircuitSettings, CIRCUITS),
    script:
        "../scripts/circuits_model.py"
