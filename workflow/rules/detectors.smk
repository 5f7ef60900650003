from headatlas.core.settings import settings_params
from headatlas.detectors.sequences import DetectorSettings, LongDetectorSettings

DETECTORS = analysis_section("detectors", "../schemas/detectors.schema.yaml")
DETECTOR_FILES = [
    "heads.tsv",
    "sinks.tsv",
    "kv_groups.tsv",
    "kv_summary.tsv",
    "inputs.tsv",
    "detectors.png",
]


register_targets(
    "detectors",
    lambda: [
        f"results/detectors/{m}/{f}"
        for m in analysis_models("detectors")
        for f in DETECTOR_FILES
    ]
    + ["results/detectors/sinks_by_model.tsv"]
    + [
        f"results/detectors/{m}/long/{c}/{f}"
        for m in analysis_models("detectors")
        for c in DETECTORS["long"]["corpora"]
        if c in model_corpora(m)  # the long corpus's `models` cover it
        for f in DETECTOR_FILES
    ],
)


rule detectors:
    input:
        corpora=lambda wc: [
            f"results/corpora/{c}.jsonl.gz"
            for c in analysis_corpora("detectors", wc.model)
        ],
        model=model_cache,
    output:
        heads="results/detectors/{model}/heads.tsv",
        heads_html=report(
            "results/detectors/{model}/heads.html",
            caption="../report/detectors_heads.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Detector scores per head (table)"},
        ),
        sinks="results/detectors/{model}/sinks.tsv",
        sinks_html=report(
            "results/detectors/{model}/sinks.html",
            caption="../report/detectors_sinks.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Sink heads per layer (table)"},
        ),
        kv_groups="results/detectors/{model}/kv_groups.tsv",
        kv_groups_html=report(
            "results/detectors/{model}/kv_groups.html",
            caption="../report/detectors_kv_groups.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Key/value groups (table)"},
        ),
        kv_summary="results/detectors/{model}/kv_summary.tsv",
        inputs="results/detectors/{model}/inputs.tsv",
    log:
        "logs/detectors/{model}.log",
    benchmark:
        "results/benchmarks/detectors/{model}.tsv"
    priority: 5  # the longest chains of the run (model-running jobs that later rules wait on) first
    conda:
        "../../envs/headatlas.yaml"
    threads: DETECTORS["threads"]
    resources:
        mem_mb=model_mem_mb(4000),
        runtime=30,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        detectors=settings_params(DetectorSettings, DETECTORS),
        model=lambda wc: MODELS[wc.model],
        corpora=lambda wc: analysis_corpora("detectors", wc.model),
    script:
        "../scripts/detectors.py"


rule detectors_figure:
    input:
        heads="results/detectors/{model}/heads.tsv",
        sinks="results/detectors/{model}/sinks.tsv",
    output:
        png=report(
            "results/detectors/{model}/detectors.png",
            caption="../report/detectors_figure.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Detector scores (figure)"},
        ),
        svg="results/detectors/{model}/detectors.svg",
    log:
        "logs/detectors_figure/{model}.log",
    benchmark:
        "results/benchmarks/detectors_figure/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/detectors_figure.py"


rule detectors_sinks_by_model:
    input:
        expand(
            "results/detectors/{model}/sinks.tsv", model=analysis_models("detectors")
        ),
    output:
        table="results/detectors/sinks_by_model.tsv",
        table_html=report(
            "results/detectors/sinks_by_model.html",
            caption="../report/detectors_sinks_by_model.rst",
            category="Detectors",
            subcategory="all models",
            labels={"item": "Sink share per model beside Gu et al. (table)"},
        ),
    log:
        "logs/detectors/sinks_by_model.log",
    benchmark:
        "results/benchmarks/detectors_sinks_by_model/sinks_by_model.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/detectors_sinks_by_model.py"


# the same job on one long corpus: every input kind as long as its `tokens`, the model spec's max_length (checked
# against the model's positions before the weights load)
rule detectors_long:
    input:
        corpus="results/corpora/{corpus}.jsonl.gz",
        model=model_cache,
    output:
        heads="results/detectors/{model}/long/{corpus}/heads.tsv",
        heads_html=report(
            "results/detectors/{model}/long/{corpus}/heads.html",
            caption="../report/detectors_heads.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Detector scores per head ({corpus}; table)"},
        ),
        sinks="results/detectors/{model}/long/{corpus}/sinks.tsv",
        sinks_html=report(
            "results/detectors/{model}/long/{corpus}/sinks.html",
            caption="../report/detectors_sinks.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Sink heads per layer ({corpus}; table)"},
        ),
        kv_groups="results/detectors/{model}/long/{corpus}/kv_groups.tsv",
        kv_groups_html=report(
            "results/detectors/{model}/long/{corpus}/kv_groups.html",
            caption="../report/detectors_kv_groups.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Key/value groups ({corpus}; table)"},
        ),
        kv_summary="results/detectors/{model}/long/{corpus}/kv_summary.tsv",
        inputs="results/detectors/{model}/long/{corpus}/inputs.tsv",
    log:
        "logs/detectors_long/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/detectors_long/{model}/{corpus}.tsv"
    priority: 5
    conda:
        "../../envs/headatlas.yaml"
    threads: DETECTORS["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=120,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        detectors=settings_params(DetectorSettings, DETECTORS),
        long=settings_params(LongDetectorSettings, DETECTORS["long"]),
        model=lambda wc: corpus_model(wc.model, wc.corpus),
    script:
        "../scripts/detectors_long.py"


rule detectors_long_figure:
    input:
        heads="results/detectors/{model}/long/{corpus}/heads.tsv",
        sinks="results/detectors/{model}/long/{corpus}/sinks.tsv",
    output:
        png=report(
            "results/detectors/{model}/long/{corpus}/detectors.png",
            caption="../report/detectors_figure.rst",
            category="Detectors",
            subcategory="{model}",
            labels={"item": "Detector scores ({corpus}; figure)"},
        ),
        svg="results/detectors/{model}/long/{corpus}/detectors.svg",
    log:
        "logs/detectors_long_figure/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/detectors_long_figure/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/detectors_long_figure.py"
