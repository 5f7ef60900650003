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


rule atlas:
    input:
        unpack(atlas_inputs),
    output:
        atlas=report(
            "results/atlas/{model}/atlas.tsv",
            caption="../report/atlas_table.rst",
            category="Head atlas",
            subcategory="{model}",
        ),
        grid=report(
            "results/atlas/{model}/atlas.png",
            caption="../report/atlas_grid.rst",
            category="Head atlas",
            subcategory="{model}",
        ),
        grid_svg="results/atlas/{model}/atlas.svg",
        agreement=report(
            "results/atlas/{model}/agreement.tsv",
            caption="../report/atlas_agreement_table.rst",
            category="Head atlas",
            subcategory="{model}",
        ),
        relations=report(
            "results/atlas/{model}/relation_heads.tsv",
            caption="../report/atlas_relation_heads.rst",
            category="Head atlas",
            subcategory="{model}",
        ),
        agreement_png=report(
            "results/atlas/{model}/agreement.png",
            caption="../report/atlas_agreement.rst",
            category="Head atlas",
            subcategory="{model}",
        ),
        profile="results/atlas/{model}/profile.tsv",
    log:
        "logs/atlas/{model}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        atlas=ATLAS,
    script:
        "../../scripts/atlas_model.py"


rule atlas_cross_model:
    input:
        expand("results/atlas/{model}/profile.tsv", model=ATLAS_MODELS),
    output:
        table="results/atlas/cross_model.tsv",
        pande=report(
            "results/atlas/cross_model_pande.png",
            caption="../report/atlas_cross_pande.rst",
            category="Head atlas",
            subcategory="all models",
        ),
        clark=report(
            "results/atlas/cross_model_clark.png",
            caption="../report/atlas_cross_clark.rst",
            category="Head atlas",
            subcategory="all models",
        ),
        probing=report(
            "results/atlas/cross_model_probing.png",
            caption="../report/atlas_cross_probing.rst",
            category="Head atlas",
            subcategory="all models",
        ),
    log:
        "logs/atlas/cross_model.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        models=ATLAS_MODELS,
    script:
        "../../scripts/atlas_cross_model.py"
