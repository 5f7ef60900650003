from headatlas.atlas.analysis import ATLAS_SOURCES, source_inputs

ATLAS = analysis_section("atlas", "../schemas/atlas.schema.yaml")
ATLAS_MODELS = analysis_models("atlas")


def atlas_inputs(wildcards):
    """The per-head tables of every analysis covering this model (the registry
    headatlas.atlas.analysis.ATLAS_SOURCES says which), and one store for the grid size.
    """
    m = wildcards.model
    out = {}
    for source in ATLAS_SOURCES:
        covered = m in analysis_models(source.analysis)
        corpora = analysis_corpora(source.analysis, m)
        out.update(source_inputs(source, m, covered, corpora, ATLAS))
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


register_targets("atlas", atlas_targets)
