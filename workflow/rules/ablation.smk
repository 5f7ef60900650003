ABLATION = analysis_section("ablation", "../schemas/ablation.schema.yaml")
# the keys the rules read (AblationSettings.from_config builds the settings from them)
ABLATION_SETTINGS = {
    k: v
    for k, v in ABLATION.items()
    if k not in ("activate", "models", "corpus", "behaviour_corpus", "threads")
}

register_targets(
    "ablation",
    lambda: [
        f"results/ablation/{m}/{name}"
        for m in analysis_models("ablation")
        for name in (
            "heads.tsv",
            "check.tsv",
            "roles.tsv",
            "pruning.tsv",
            "pruning.png",
        )
    ],
)


def ablation_task(wildcards):
    """The finetune_tasks entry of a fine-tuned model (its dev file is the classification set), else None."""
    ft = MODELS[wildcards.model]["source"].get("finetuned")
    return dict(config["finetune_tasks"][ft["task"]], name=ft["task"]) if ft else None


def ablation_inputs(wildcards):
    out = {
        "corpus": f"results/corpora/{ABLATION['corpus']}.jsonl.gz",
        "model": model_cache(wildcards),
    }
    task = ablation_task(wildcards)
    if task:
        out["dev"] = task["dev"]
    return out


def ablation_role_inputs(wildcards):
    """The role TSVs of the analyses covering the model (read as TSVs only)."""
    m = wildcards.model
    out = dict(ablation_inputs(wildcards), heads=f"results/ablation/{m}/heads.tsv")
    if m in analysis_models("pande"):
        out["pande"] = f"results/pande/{m}/heads.tsv"
    if ABLATION["behaviour_corpus"] in (analysis_corpora("clark_surface", m) or []):
        out["behaviour"] = (
            f"results/clark/{m}/{ABLATION['behaviour_corpus']}/behaviour.tsv"
        )
    if m in analysis_models("clark_syntax"):
        out["syntax"] = f"results/clark/{m}/syntax/heads.tsv"
        out["syntax_baselines"] = f"results/clark/{m}/syntax/baselines.tsv"
    return out


rule ablation_heads:
    input:
        unpack(ablation_inputs),
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
            labels={"item": "Attribution patching vs exact ablation (table)"},
        ),
    log:
        "logs/ablation_heads/{model}.log",
    benchmark:
        "results/benchmarks/ablation_heads/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: ABLATION["threads"]
    resources:
        mem_mb=6000,
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        task=ablation_task,
        ablation=ABLATION_SETTINGS,
    script:
        "../../scripts/ablation_heads.py"


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
    conda:
        "../../envs/headatlas.yaml"
    threads: ABLATION["threads"]
    resources:
        mem_mb=6000,
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        task=ablation_task,
        ablation=ABLATION_SETTINGS,
    script:
        "../../scripts/ablation_roles.py"
