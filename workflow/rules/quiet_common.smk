from headatlas.core.settings import settings_params
from headatlas.quiet.analysis import QuietSettings

QUIET = analysis_section("quiet", "../schemas/quiet.schema.yaml")

register_targets(
    "quiet",
    lambda: [
        f"results/quiet/{m}/{f}"
        for m in analysis_models("quiet")
        for f in ("heads.tsv", "summary.tsv", "massive.tsv", "quiet.png")
    ],
)


def quiet_heads_inputs(wildcards):
    """The model's own statistics and zero-ablation, and the detectors' heads.tsv where they cover the model."""
    m = wildcards.model
    out = {
        "stats": f"results/quiet/{m}/stats.tsv",
        "zero": f"results/quiet/{m}/zero_ablation.tsv",
    }
    if m in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{m}/heads.tsv"
    return out
