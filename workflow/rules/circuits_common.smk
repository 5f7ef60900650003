from headatlas.circuits.analysis import CircuitSettings
from headatlas.circuits.induction import InductionSettings
from headatlas.circuits.longrange import LongSettings
from headatlas.core.settings import settings_params
from headatlas.detectors.sequences import DetectorSettings

CIRCUITS = analysis_section("circuits", "../schemas/circuits.schema.yaml")
# the detectors' keys that build their repeated random sequences (the induction check's inputs)
CIRCUIT_DETECTOR_KEYS = ["n_sequences", "length", "repeat_length", "seed", "batch_size"]


def circuits_targets():
    out = []
    for m in analysis_models("circuits"):
        out += [
            f"results/circuits/{m}/{f}"
            for f in (
                "heads.tsv",
                "agreement.tsv",
                "composition.png",
                "composition_summary.tsv",
                "induction.tsv",
                "retrieval_bins.tsv",
                "window_check.tsv",
            )
        ]
    return out


register_targets("circuits", circuits_targets)


def circuits_model_inputs(wildcards):
    """What the per-model join reads: its own tables, and the detectors' and ablation's TSVs where they exist."""
    m = wildcards.model
    out = {
        name: f"results/circuits/{m}/{f}.tsv"
        for name, f in (
            ("weights", "weights_heads"),
            ("pairs", "composition"),
            ("long", "long_heads"),
            ("induction", "induction"),
            ("induction_heads", "induction_heads"),
        )
    }
    if m in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{m}/heads.tsv"
    if m in analysis_models("ablation"):
        out["ablation"] = f"results/ablation/{m}/heads.tsv"
    return out


def circuits_causal_inputs(wildcards):
    """The model, the haystack, the composition pairs and, where they cover the model, the detectors' table (the
    induction check's head lists and the short-range induction scores)."""
    m = wildcards.model
    out = {
        "model": model_cache(wildcards),
        "haystack": CIRCUITS["long"]["haystack"],
        "pairs": f"results/circuits/{m}/composition.tsv",
    }
    if m in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{m}/heads.tsv"
    return out
