ATLAS = validate_section("atlas", "../schemas/atlas.schema.yaml")
ATLAS_MODELS = [m for m in MODELS if m not in helper_models()]


def atlas_inputs(wildcards):
    """The per-head tables of every analysis configured for this model."""
    m = wildcards.model
    out = {}
    corpus = ATLAS["surface_corpus"]
    if corpus in CLARK["corpora"] and corpus in model_corpora(m):
        out["behaviour"] = f"results/clark/{m}/{corpus}/behaviour.tsv"
        out["mds"] = f"results/clark/{m}/{corpus}/mds.tsv"
    if m in PANDE_MODELS and PANDE_CORPORA[m]:
        out["pande"] = f"results/pande/{m}/heads.tsv"
    if m in CLARK_SYNTAX_MODELS:
        out["syntax"] = f"results/clark/{m}/syntax/heads.tsv"
        out["syntax_baselines"] = f"results/clark/{m}/syntax/baselines.tsv"
        out["coref"] = f"results/clark/{m}/coref/heads.tsv"
    if m in JM_MODELS:
        out["probes"] = f"results/jomyaeng/{m}/heads.tsv"
    out["tokens"] = f"{shard_dirs(m, model_corpora(m)[0])[0]}"
    return out


def atlas_targets():
    files = [
        "atlas.tsv",
        "atlas.png",
        "agreement.tsv",
        "relation_heads.tsv",
        "agreement.png",
        "profile.tsv",
    ]
    out = expand("results/atlas/{model}/{f}", model=ATLAS_MODELS, f=files)
    return (
        out
        + expand(
            "results/atlas/cross_model_{family}.png",
            family=["pande", "clark", "probing"],
        )
        + ["results/atlas/cross_model.tsv"]
    )


TARGET_FUNCTIONS.append(atlas_targets)
