from headatlas.core.settings import settings_params
from headatlas.jomyaeng.analysis import TopNSettings
from headatlas.jomyaeng.probes import ProbeConfig
from headatlas.jomyaeng.probing_tasks import GeneratorConfig

JM = analysis_section("jomyaeng", "../schemas/jomyaeng.schema.yaml")
JM_PROBING = list(JM["generator"]["tasks"])
JM_DOWNSTREAM = list(JM["downstream"])
JM_TASKS = JM_PROBING + JM_DOWNSTREAM
JM_FILES = {JM["probing_corpus"]: "results/probing/sentences.jsonl.gz"}
if JM_DOWNSTREAM:
    JM_FILES[JM["downstream_corpus"]] = "results/probing/downstream_sentences.jsonl.gz"
JM_MODELS = analysis_models("jomyaeng")
# figure -> its label in the report
JM_FIGURES = {
    "heatmap_sorted": "Fig. 2-4 per-head accuracy, heads sorted within each layer",
    "heatmap_unsorted": "Per-head accuracy, layers x heads",
    "heatmap_selectivity": "Per-head selectivity against a control task, layers x heads",
    "task_correlation": "Fig. 5a correlation between tasks across heads",
    "categories": "Fig. 5b surface, syntactic and semantic score per head",
    "focused": "Focused vs distributed information per task",
    "topn_curve": "Fig. 6 top-n heads against the best layer",
    "layer_profile": "Where each task's information sits, per layer",
}

if analysis_active("jomyaeng"):
    for _corpus, _path in JM_FILES.items():
        _spec = CORPORA.get(_corpus, {})
        if _spec.get("kind") != "records" or _spec.get("path") != _path:
            raise ValueError(
                f"config key analysis.jomyaeng: corpus {_corpus!r} must be defined in corpora as "
                f"{{kind: records, path: {_path}, maps: false}}"
            )


JM_TARGETS = (
    expand("results/jomyaeng/{model}/heads.tsv", model=JM_MODELS)
    + expand(
        "results/jomyaeng/{model}/{figure}.png", model=JM_MODELS, figure=JM_FIGURES
    )
    + ["results/jomyaeng/summary.tsv", "results/probing/task_stats.tsv"]
    + (["results/probing/downstream_stats.tsv"] if JM_DOWNSTREAM else [])
)
register_targets("jomyaeng", lambda: JM_TARGETS)


rule jomyaeng_probing_tasks:
    input:
        treebanks=[p for tb in JM["sources"]["treebanks"].values() for p in tb.values()],
        trees=[p for tb in JM["sources"]["trees"].values() for p in tb.values()],
    output:
        sentences="results/probing/sentences.jsonl.gz",
        table="results/probing/tasks.tsv.gz",
        stats="results/probing/task_stats.tsv",
        stats_html=report(
            "results/probing/task_stats.html",
            caption="../report/jomyaeng_tasks.rst",
            category="Jo & Myaeng probing",
            subcategory="Task data",
            labels={"item": "Probing tasks: sizes and labels (table)"},
        ),
    log:
        "logs/jomyaeng/probing_tasks.log",
    benchmark:
        "results/benchmarks/jomyaeng_probing_tasks.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=20,
    params:
        sources=JM["sources"],
        generator=settings_params(GeneratorConfig, JM["generator"]),
    script:
        "../scripts/jomyaeng_probing_tasks.py"


rule jomyaeng_downstream_tasks:
    input:
        [t[s] for t in JM["downstream"].values() for s in ("train", "dev", "test")],
    output:
        sentences="results/probing/downstream_sentences.jsonl.gz",
        table="results/probing/downstream_tasks.tsv.gz",
        stats="results/probing/downstream_stats.tsv",
        stats_html=report(
            "results/probing/downstream_stats.html",
            caption="../report/jomyaeng_tasks.rst",
            category="Jo & Myaeng probing",
            subcategory="Task data",
            labels={"item": "Downstream tasks: sizes and labels (table)"},
        ),
    log:
        "logs/jomyaeng/downstream_tasks.log",
    benchmark:
        "results/benchmarks/jomyaeng_downstream_tasks.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        tasks=JM["downstream"],
        seed=JM["downstream_seed"],
    script:
        "../scripts/jomyaeng_downstream_tasks.py"


# Jo & Myaeng's probes: one job per model x task, or (probe_jobs: model) one job per model
# running every task in turn; the same files and numbers either way
if JM["probe_jobs"] == "task":

    rule jomyaeng_probe:
        input:
            shards=lambda wc: shard_dirs(
                wc.model,
                (
                    JM["probing_corpus"]
                    if wc.task in JM_PROBING
                    else JM["downstream_corpus"]
                ),
            ),
            table=lambda wc: (
                "results/probing/tasks.tsv.gz"
                if wc.task in JM_PROBING
                else "results/probing/downstream_tasks.tsv.gz"
            ),
        output:
            "results/jomyaeng/{model}/tasks/{task}.tsv",
        log:
            "logs/jomyaeng/probe/{model}/{task}.log",
        benchmark:
            "results/benchmarks/jomyaeng_probe/{model}/{task}.tsv"
        wildcard_constraints:
            task="|".join(JM_TASKS) or "-",
        conda:
            "../../envs/headatlas.yaml"
        threads: 1
        resources:
            mem_mb=4000,
            runtime=60,
        params:
            probe=settings_params(ProbeConfig, JM["probe"]),
            top=settings_params(TopNSettings, JM),
            task=lambda wc: (
                {"kind": "probing"}
                if wc.task in JM_PROBING
                else JM["downstream"][wc.task]
            ),
        script:
            "../scripts/jomyaeng_probe.py"

else:

    rule jomyaeng_probe:
        input:
            probing_shards=lambda wc: shard_dirs(wc.model, JM["probing_corpus"]),
            probing_table="results/probing/tasks.tsv.gz",
            downstream_shards=lambda wc: (
                shard_dirs(wc.model, JM["downstream_corpus"]) if JM_DOWNSTREAM else []
            ),
            downstream_table=(
                "results/probing/downstream_tasks.tsv.gz" if JM_DOWNSTREAM else []
            ),
        output:
            **{t: f"results/jomyaeng/{{model}}/tasks/{t}.tsv" for t in JM_TASKS},
        log:
            "logs/jomyaeng/probe/{model}.log",
        benchmark:
            "results/benchmarks/jomyaeng_probe/{model}.tsv"
        conda:
            "../../envs/headatlas.yaml"
        threads: 1
        resources:
            mem_mb=4000,
            runtime=60 * len(JM_TASKS),
        params:
            probe=settings_params(ProbeConfig, JM["probe"]),
            top=settings_params(TopNSettings, JM),
            tasks={
                t: {"kind": "probing"} if t in JM_PROBING else JM["downstream"][t]
                for t in JM_TASKS
            },
        script:
            "../scripts/jomyaeng_probe.py"


rule jomyaeng_tables:
    input:
        expand("results/jomyaeng/{{model}}/tasks/{task}.tsv", task=JM_TASKS),
    output:
        heads="results/jomyaeng/{model}/heads.tsv",
        heads_html=report(
            "results/jomyaeng/{model}/heads.html",
            caption="../report/jomyaeng_heads.rst",
            category="Jo & Myaeng probing",
            subcategory="{model}",
            labels={"item": "Per-head probe accuracy and selectivity (table)"},
        ),
        layers="results/jomyaeng/{model}/layers.tsv",
        topn="results/jomyaeng/{model}/topn.tsv",
        summary="results/jomyaeng/{model}/summary.tsv",
        summary_html=report(
            "results/jomyaeng/{model}/summary.html",
            caption="../report/jomyaeng_summary.rst",
            category="Jo & Myaeng probing",
            subcategory="{model}",
            labels={"item": "Summary per task against the paper (table)"},
        ),
    log:
        "logs/jomyaeng/tables/{model}.log",
    benchmark:
        "results/benchmarks/jomyaeng_tables/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        top=settings_params(TopNSettings, JM, "top_n"),
    script:
        "../scripts/jomyaeng_tables.py"


rule jomyaeng_figures:
    input:
        heads="results/jomyaeng/{model}/heads.tsv",
        layers="results/jomyaeng/{model}/layers.tsv",
        topn="results/jomyaeng/{model}/topn.tsv",
        summary="results/jomyaeng/{model}/summary.tsv",
    output:
        **{
            f: report(
                f"results/jomyaeng/{{model}}/{f}.png",
                caption=f"../report/jomyaeng_{f}.rst",
                category="Jo & Myaeng probing",
                subcategory="{model}",
                labels={"item": label},
            )
            for f, label in JM_FIGURES.items()
        },
        **{f"{f}_svg": f"results/jomyaeng/{{model}}/{f}.svg" for f in JM_FIGURES},
    log:
        "logs/jomyaeng/figures/{model}.log",
    benchmark:
        "results/benchmarks/jomyaeng_figures/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        probing=JM_PROBING,
        downstream=JM_DOWNSTREAM,
    script:
        "../scripts/jomyaeng_figures.py"


rule jomyaeng_summary:
    input:
        expand("results/jomyaeng/{model}/summary.tsv", model=JM_MODELS),
    output:
        "results/jomyaeng/summary.tsv",
        html=report(
            "results/jomyaeng/summary.html",
            caption="../report/jomyaeng_overview.rst",
            category="Jo & Myaeng probing",
            subcategory="all models",
            labels={"item": "Summary of every model per task (table)"},
        ),
    log:
        "logs/jomyaeng/summary.log",
    benchmark:
        "results/benchmarks/jomyaeng_summary.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/jomyaeng_summary.py"
