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
