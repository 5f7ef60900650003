CIRCUITS = analysis_section("circuits", "../schemas/circuits.schema.yaml")
# the keys the rules read (the settings classes' from_config build the objects from them)
CIRCUIT_KEYS = [
    "n_tokens",
    "top_k",
    "seed",
    "bootstrap",
    "ci",
    "alpha",
    "fdr_method",
    "agreement_top_k",
    "edges",
]
# the detectors' keys that build their repeated random sequences (the induction check's inputs)
CIRCUIT_DETECTOR_KEYS = ["n_sequences", "length", "repeat_length", "seed", "batch_size"]


def circuits_induction_on(model):
    """The induction check runs where it is on and the detectors cover the model (it reads their table)."""
    return CIRCUITS["induction"]["activate"] and model in analysis_models("detectors")


def circuits_targets():
    out = []
    for m in analysis_models("circuits"):
        out += [
            f"results/circuits/{m}/{f}"
            for f in ("heads.tsv", "agreement.tsv", "composition.png")
        ]
        out.append(f"results/circuits/{m}/composition_summary.tsv")
        if circuits_induction_on(m):
            out.append(f"results/circuits/{m}/induction.tsv")
        if CIRCUITS["long"]["activate"]:
            out.append(f"results/circuits/{m}/retrieval_bins.tsv")
    return out


register_targets("circuits", circuits_targets)


def circuits_model_inputs(wildcards):
    """What the per-model join reads: its own tables, and the detectors' and ablation's TSVs where they exist."""
    m = wildcards.model
    out = {
        "weights": f"results/circuits/{m}/weights_heads.tsv",
        "pairs": f"results/circuits/{m}/composition.tsv",
    }
    if CIRCUITS["long"]["activate"]:
        out["long"] = f"results/circuits/{m}/long_heads.tsv"
    if circuits_induction_on(m):
        out["induction"] = f"results/circuits/{m}/induction.tsv"
        out["induction_heads"] = f"results/circuits/{m}/induction_heads.tsv"
    if m in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{m}/heads.tsv"
    if m in analysis_models("ablation"):
        out["ablation"] = f"results/ablation/{m}/heads.tsv"
    return out


def circuits_long_inputs(wildcards):
    out = {"model": model_cache(wildcards), "haystack": CIRCUITS["long"]["haystack"]}
    if wildcards.model in analysis_models("detectors"):
        out["detectors"] = f"results/detectors/{wildcards.model}/heads.tsv"
    return out
