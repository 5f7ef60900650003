from headatlas.ablation.analysis import AblationSettings
from headatlas.core.settings import settings_params

ABLATION = analysis_section("ablation", "../schemas/ablation.schema.yaml")
# the keys the rules read (AblationSettings.from_config builds the settings from them)
ABLATION_SETTINGS = settings_params(AblationSettings, ABLATION)

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
            "removable.tsv",
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
