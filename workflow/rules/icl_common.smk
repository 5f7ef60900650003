from headatlas.core.settings import settings_params
from headatlas.icl.analysis import IclSettings
from headatlas.icl.exclusion import ExclusionSettings
from headatlas.icl.tasks import FILE_TASKS

ICL = analysis_section("icl", "../schemas/icl.schema.yaml")
ICL_SETTINGS = settings_params(IclSettings, ICL)
ICL_EXCLUSION = settings_params(ExclusionSettings, ICL["exclusion"])
ICL_EWT = [
    "resources/ud_english_ewt/en_ewt-ud-train.conllu.gz",
    "resources/ud_english_ewt/en_ewt-ud-dev.conllu",
    "resources/ud_english_ewt/en_ewt-ud-test.conllu",
]

register_targets(
    "icl",
    lambda: [
        f"results/icl/{m}/{name}"
        for m in analysis_models("icl")
        for name in ("tasks.tsv", "fv_heads.tsv", "check.tsv", "fv_heads.png")
    ]
    + [
        f"results/icl/{m}/agreement.tsv"
        for m in analysis_models("icl")
        if m in analysis_models("atlas")
    ]
    + [
        f"results/icl/{m}/exclusion.tsv"
        for m in analysis_models("icl")
        if ICL["exclusion"]["activate"]
    ],
)


def icl_inputs(wildcards):
    """The model, the EWT files and the word list of every file task configured."""
    out = {"model": model_cache(wildcards), "ewt": ICL_EWT}
    for task in FILE_TASKS:
        if task in ICL["tasks"]:
            out[task] = f"resources/icl/{task}.tsv"
    return out


def icl_figure_inputs(wildcards):
    """The head table and, where the detectors cover the model, their table (induction beside the AIE)."""
    out = {"heads": f"results/icl/{wildcards.model}/fv_heads.tsv"}
    if wildcards.model in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{wildcards.model}/heads.tsv"
    return out


def icl_exclusion_inputs(wildcards):
    """The model's ICL inputs, its FV head table, the running text and, where the detectors cover the model,
    their table (the induction scores)."""
    out = dict(icl_figure_inputs(wildcards), **icl_inputs(wildcards))
    out["text"] = ICL["exclusion"]["text"]
    return out
