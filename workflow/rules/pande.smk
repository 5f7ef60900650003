from headatlas.core.settings import settings_params
from headatlas.pande.hypothesis import HypothesisSettings
from headatlas.pande.sieves import SieveSettings

PANDE = analysis_section("pande", "../schemas/pande.schema.yaml")
PANDE_MODELS = analysis_models("pande")
if set(PANDE["corpora"]) - set(CORPORA):
    raise ValueError(
        f"config key analysis.pande: unknown corpora {sorted(set(PANDE['corpora']) - set(CORPORA))}; "
        f"known corpora {sorted(CORPORA)}"
    )
# per model, the analysed corpora that are extracted for it
PANDE_CORPORA = {m: analysis_corpora("pande", m) for m in PANDE_MODELS}
# fine-tuned model -> its base, when both are analysed
PANDE_FINETUNED = {
    m: MODELS[m]["source"]["finetuned"]["base"]
    for m in PANDE_MODELS
    if "finetuned" in MODELS[m]["source"]
    and MODELS[m]["source"]["finetuned"]["base"] in PANDE_MODELS
}
# per corpus, the spaCy parse it needs (none when its gold trees are used)
PANDE_TREES = {
    c: (
        []
        if PANDE["trees"] == "auto"
        and CORPORA[c]["kind"] in ("conllu", "conllu_documents")
        else [f"results/parses/{c}.jsonl.gz"]
    )
    for c in CORPORA
}
# a fused corpus's extraction runs the sieve reducer on these trees
FUSED_TREES["pande"] = lambda corpus: PANDE_TREES[corpus]
PANDE_FILES = [
    "heads.tsv",
    "heads_by_corpus.tsv",
    "length.tsv",
    "length_trend.tsv",
    "length.png",
    "role_grid.png",
    "colocation.tsv",
    "colocation.png",
    "layers.tsv",
    "layers.png",
    "pvalues.png",
    "heatmap.png",
    "summary.json",
]
register_targets(
    "pande",
    lambda: [
        f"results/pande/{m}/{f}"
        for m in PANDE_MODELS
        if PANDE_CORPORA[m]
        for f in PANDE_FILES
    ]
    + [
        f"results/pande/{m}/finetune_{f}"
        for m in PANDE_FINETUNED
        if PANDE_CORPORA[m]
        for f in ("compare.tsv", "roles_by_layer.png", "sep_by_layer.png")
    ],
)


rule parse_corpus:
    input:
        "results/corpora/{corpus}.jsonl.gz",
    output:
        "results/parses/{corpus}.jsonl.gz",
    log:
        "logs/parse_corpus/{corpus}.log",
    benchmark:
        "results/benchmarks/parse_corpus/{corpus}.tsv"
    priority: 10  # feeds the extraction (rule extract_attention): the spine first
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=20,
    params:
        parser=PANDE["parser"],
    script:
        "../scripts/parse_corpus.py"


rule pande_scores:
    input:
        shards=lambda wc: shard_dirs(wc.model, wc.corpus),
        corpus="results/corpora/{corpus}.jsonl.gz",
        trees=lambda wc: PANDE_TREES[wc.corpus],
    output:
        "results/pande/{model}/scores/{corpus}.h5",
    log:
        "logs/pande_scores/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/pande_scores/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        sieves=settings_params(SieveSettings, PANDE),
    script:
        "../scripts/pande_scores.py"


rule pande_test:
    input:
        lambda wc: expand(
            "results/pande/{model}/scores/{corpus}.h5",
            model=wc.model,
            corpus=PANDE_CORPORA[wc.model],
        ),
    output:
        heads="results/pande/{model}/heads.tsv",
        heads_html=report(
            "results/pande/{model}/heads.html",
            caption="../report/pande_heads.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Roles per head: tests and stability (table)"},
        ),
        by_corpus="results/pande/{model}/heads_by_corpus.tsv",
        by_corpus_html=report(
            "results/pande/{model}/heads_by_corpus.html",
            caption="../report/pande_heads_by_corpus.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Roles per head, per corpus (table)"},
        ),
    log:
        "logs/pande_test/{model}.log",
    benchmark:
        "results/benchmarks/pande_test/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        tests=settings_params(HypothesisSettings, PANDE),
    script:
        "../scripts/pande_test.py"


rule pande_length:
    input:
        scores=lambda wc: expand(
            "results/pande/{model}/scores/{corpus}.h5",
            model=wc.model,
            corpus=PANDE_CORPORA[wc.model],
        ),
        heads="results/pande/{model}/heads.tsv",
    output:
        table="results/pande/{model}/length.tsv",
        trend="results/pande/{model}/length_trend.tsv",
        figure=report(
            "results/pande/{model}/length.png",
            caption="../report/pande_length.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Sieve score against sequence length"},
        ),
        figure_svg="results/pande/{model}/length.svg",
    log:
        "logs/pande_length/{model}.log",
    benchmark:
        "results/benchmarks/pande_length/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        bins=PANDE["length_bins"],
        heads=PANDE["length_heads"],
    script:
        "../scripts/pande_length.py"


rule pande_figures:
    input:
        "results/pande/{model}/heads.tsv",
    output:
        grid=report(
            "results/pande/{model}/role_grid.png",
            caption="../report/pande_role_grid.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Roles per head, layers x heads"},
        ),
        grid_svg="results/pande/{model}/role_grid.svg",
        colocation="results/pande/{model}/colocation.tsv",
        colocation_html=report(
            "results/pande/{model}/colocation.html",
            caption="../report/pande_colocation_table.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Co-location of roles (table)"},
        ),
        colocation_png=report(
            "results/pande/{model}/colocation.png",
            caption="../report/pande_colocation.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Co-location of roles"},
        ),
        colocation_svg="results/pande/{model}/colocation.svg",
        layers="results/pande/{model}/layers.tsv",
        layers_png=report(
            "results/pande/{model}/layers.png",
            caption="../report/pande_layers.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Heads per role and layer"},
        ),
        layers_svg="results/pande/{model}/layers.svg",
        pvalues=report(
            "results/pande/{model}/pvalues.png",
            caption="../report/pande_pvalues.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "p-values near 0 or 1"},
        ),
        pvalues_svg="results/pande/{model}/pvalues.svg",
        heatmap=report(
            "results/pande/{model}/heatmap.png",
            caption="../report/pande_heatmap.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Mean sieve score per head, layers x heads"},
        ),
        heatmap_svg="results/pande/{model}/heatmap.svg",
        summary="results/pande/{model}/summary.json",
    log:
        "logs/pande_figures/{model}.log",
    benchmark:
        "results/benchmarks/pande_figures/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        near_p=PANDE["near_p"],
    script:
        "../scripts/pande_figures.py"


rule pande_finetune_compare:
    input:
        base=lambda wc: f"results/pande/{PANDE_FINETUNED[wc.model]}/heads.tsv",
        tuned="results/pande/{model}/heads.tsv",
        model_dir=lambda wc: model_dir(wc.model),
    output:
        table="results/pande/{model}/finetune_compare.tsv",
        roles=report(
            "results/pande/{model}/finetune_roles_by_layer.png",
            caption="../report/pande_finetune_roles.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={"item": "Fine-tuning: heads per role and layer, before vs after"},
        ),
        roles_svg="results/pande/{model}/finetune_roles_by_layer.svg",
        sep=report(
            "results/pande/{model}/finetune_sep_by_layer.png",
            caption="../report/pande_finetune_sep.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
            labels={
                "item": "Fine-tuning: attention to [SEP] per layer, before vs after"
            },
        ),
        sep_svg="results/pande/{model}/finetune_sep_by_layer.svg",
    log:
        "logs/pande_finetune_compare/{model}.log",
    benchmark:
        "results/benchmarks/pande_finetune_compare/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/pande_finetune_compare.py"
