include: "atlas_common.smk"


rule atlas:
    input:
        unpack(atlas_inputs),
    output:
        atlas="results/atlas/{model}/atlas.tsv",
        atlas_html=report(
            "results/atlas/{model}/atlas.html",
            caption="../report/atlas_table.rst",
            category="Head atlas",
            subcategory="{model}",
            labels={"item": "Atlas: one row per head, every analysis (table)"},
        ),
        grid=report(
            "results/atlas/{model}/atlas.png",
            caption="../report/atlas_grid.rst",
            category="Head atlas",
            subcategory="{model}",
            labels={"item": "Atlas grid: every head, layers x heads"},
        ),
        grid_svg="results/atlas/{model}/atlas.svg",
        agreement="results/atlas/{model}/agreement.tsv",
        agreement_html=report(
            "results/atlas/{model}/agreement.html",
            caption="../report/atlas_agreement_table.rst",
            category="Head atlas",
            subcategory="{model}",
            labels={"item": "Agreement between the methods (table)"},
        ),
        relations="results/atlas/{model}/relation_heads.tsv",
        relations_html=report(
            "results/atlas/{model}/relation_heads.html",
            caption="../report/atlas_relation_heads.rst",
            category="Head atlas",
            subcategory="{model}",
            labels={"item": "Clark's and Pande's heads per relation (table)"},
        ),
        agreement_png=report(
            "results/atlas/{model}/agreement.png",
            caption="../report/atlas_agreement.rst",
            category="Head atlas",
            subcategory="{model}",
            labels={"item": "Agreement between the methods"},
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
        atlas=settings_params(AtlasSettings, ATLAS),
    script:
        "../scripts/atlas.py"


rule atlas_cross_model:
    input:
        profiles=expand("results/atlas/{model}/profile.tsv", model=ATLAS_MODELS),
        atlases=expand("results/atlas/{model}/atlas.tsv", model=ATLAS_MODELS),
        agreements=expand("results/atlas/{model}/agreement.tsv", model=ATLAS_MODELS),
    output:
        table="results/atlas/cross_model.tsv",
        ladder="results/atlas/ladder.tsv",
        ladder_html=report(
            "results/atlas/ladder.html",
            caption="../report/atlas_ladder.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "The models side by side: one row per model (table)"},
        ),
        pande=report(
            "results/atlas/cross_model_pande.png",
            caption="../report/atlas_cross_pande.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "Pande roles per layer, every model"},
        ),
        pande_svg="results/atlas/cross_model_pande.svg",
        clark=report(
            "results/atlas/cross_model_clark.png",
            caption="../report/atlas_cross_clark.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "Clark behaviours per layer, every model"},
        ),
        clark_svg="results/atlas/cross_model_clark.svg",
        probing=report(
            "results/atlas/cross_model_probing.png",
            caption="../report/atlas_cross_probing.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "Jo & Myaeng probing per layer, every model"},
        ),
        probing_svg="results/atlas/cross_model_probing.svg",
        detectors=report(
            "results/atlas/cross_model_detectors.png",
            caption="../report/atlas_cross_detectors.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "Detectors and retrieval heads per layer, every model"},
        ),
        detectors_svg="results/atlas/cross_model_detectors.svg",
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
        "../scripts/atlas_cross_model.py"


rule atlas_page:
    input:
        atlas_page_inputs,
    output:
        report(
            "results/atlas/index.html",
            caption="../report/atlas_page.rst",
            category="Head atlas",
            subcategory="all models",
            labels={"item": "Interactive atlas page (HTML)"},
        ),
    log:
        "logs/atlas/page.log",
    benchmark:
        "results/benchmarks/atlas_page/page.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        page=settings_params(PageSettings, ATLAS["page"]),
        sources=atlas_page_sources(),
    script:
        "../scripts/atlas_page.py"
