include: "atlas_common.smk"


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
        agreement_svg="results/atlas/{model}/agreement.svg",
        profile="results/atlas/{model}/profile.tsv",
    log:
        "logs/atlas/{model}.log",
    benchmark:
        "results/benchmarks/atlas/{model}.tsv"
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
        pande_svg="results/atlas/cross_model_pande.svg",
        clark=report(
            "results/atlas/cross_model_clark.png",
            caption="../report/atlas_cross_clark.rst",
            category="Head atlas",
            subcategory="all models",
        ),
        clark_svg="results/atlas/cross_model_clark.svg",
        probing=report(
            "results/atlas/cross_model_probing.png",
            caption="../report/atlas_cross_probing.rst",
            category="Head atlas",
            subcategory="all models",
        ),
        probing_svg="results/atlas/cross_model_probing.svg",
    log:
        "logs/atlas/cross_model.log",
    benchmark:
        "results/benchmarks/atlas_cross_model.tsv"
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
