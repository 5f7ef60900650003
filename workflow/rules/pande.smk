PANDE = validate_section("pande", "../schemas/pande.schema.yaml")
GOLD_TREE_KINDS = ("conllu", "conllu_documents")


def pande_models():
    """Models analysed: analysis.pande.models, or every model that is not a helper."""
    names = PANDE["models"] or [m for m in MODELS if m not in helper_models()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise ValueError(
            f"config key analysis.pande.models: unknown models {unknown}; known: {sorted(MODELS)}"
        )
    return names


def pande_corpora(model):
    """The analysed corpora that are extracted for ``model``."""
    for corpus in PANDE["corpora"]:
        if corpus not in CORPORA:
            raise ValueError(
                f"config key analysis.pande.corpora: unknown corpus {corpus!r}; known: {sorted(CORPORA)}"
            )
    return [c for c in PANDE["corpora"] if c in model_corpora(model)]


def pande_trees(wildcards):
    """The spaCy parse a corpus needs, or nothing when its gold trees are used."""
    kind = CORPORA[wildcards.corpus]["kind"]
    if PANDE["trees"] == "auto" and kind in GOLD_TREE_KINDS:
        return []
    return [f"results/parses/{wildcards.corpus}.jsonl.gz"]


def pande_scores(wildcards):
    corpora = pande_corpora(wildcards.model)
    if not corpora:
        raise ValueError(
            f"model {wildcards.model}: none of analysis.pande.corpora {PANDE['corpora']} is extracted for it"
        )
    return [f"results/pande/{wildcards.model}/scores/{c}.h5" for c in corpora]


def pande_finetuned():
    """Fine-tuned models analysed together with their base."""
    models = pande_models()
    return [
        m
        for m in models
        if "finetuned" in MODELS[m]["source"]
        and MODELS[m]["source"]["finetuned"]["base"] in models
    ]


def pande_base(wildcards):
    base = MODELS[wildcards.model]["source"]["finetuned"]["base"]
    return f"results/pande/{base}/heads.tsv"


PANDE_FIGURES = [
    "heads.tsv",
    "role_grid.png",
    "colocation.tsv",
    "colocation.png",
    "layers.tsv",
    "layers.png",
    "pvalues.png",
    "heatmap.png",
    "summary.json",
]


def pande_targets():
    if not PANDE["corpora"]:
        return []
    out = [
        f"results/pande/{m}/{f}"
        for m in pande_models()
        if pande_corpora(m)
        for f in PANDE_FIGURES
    ]
    for m in pande_finetuned():
        out += [
            f"results/pande/{m}/finetune_{f}"
            for f in ("compare.tsv", "roles_by_layer.png", "sep_by_layer.png")
        ]
    return out


TARGET_FUNCTIONS.append(pande_targets)


rule parse_corpus:
    input:
        "results/corpora/{corpus}.jsonl.gz",
    output:
        "results/parses/{corpus}.jsonl.gz",
    log:
        "logs/parse_corpus/{corpus}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=20,
    params:
        parser=PANDE["parser"],
    script:
        "../../scripts/parse_corpus.py"


rule pande_scores:
    input:
        shards=lambda wc: shard_dirs(wc.model, wc.corpus),
        corpus="results/corpora/{corpus}.jsonl.gz",
        trees=pande_trees,
    output:
        "results/pande/{model}/scores/{corpus}.h5",
    log:
        "logs/pande_scores/{model}/{corpus}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        sieves={
            k: PANDE[k]
            for k in (
                "local_window",
                "relations",
                "relation_labels",
                "direction",
                "block_entropy",
            )
        },
    script:
        "../../scripts/pande_scores.py"


rule pande_test:
    input:
        pande_scores,
    output:
        report(
            "results/pande/{model}/heads.tsv",
            caption="../report/pande_heads.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
    log:
        "logs/pande_test/{model}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        tests={
            k: PANDE[k]
            for k in (
                "tau",
                "alpha",
                "ddof",
                "fdr_method",
                "bootstrap",
                "ci",
                "nonparametric",
                "permutations",
                "seed",
            )
        },
    script:
        "../../scripts/pande_test.py"


rule pande_figures:
    input:
        "results/pande/{model}/heads.tsv",
    output:
        grid=report(
            "results/pande/{model}/role_grid.png",
            caption="../report/pande_role_grid.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        grid_svg="results/pande/{model}/role_grid.svg",
        colocation=report(
            "results/pande/{model}/colocation.tsv",
            caption="../report/pande_colocation_table.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        colocation_png=report(
            "results/pande/{model}/colocation.png",
            caption="../report/pande_colocation.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        layers="results/pande/{model}/layers.tsv",
        layers_png=report(
            "results/pande/{model}/layers.png",
            caption="../report/pande_layers.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        pvalues=report(
            "results/pande/{model}/pvalues.png",
            caption="../report/pande_pvalues.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        heatmap=report(
            "results/pande/{model}/heatmap.png",
            caption="../report/pande_heatmap.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        summary="results/pande/{model}/summary.json",
    log:
        "logs/pande_figures/{model}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        near_p=PANDE["near_p"],
    script:
        "../../scripts/pande_figures.py"


rule pande_finetune_compare:
    input:
        base=pande_base,
        tuned="results/pande/{model}/heads.tsv",
        model_dir=lambda wc: model_dir(wc.model),
    output:
        table="results/pande/{model}/finetune_compare.tsv",
        roles=report(
            "results/pande/{model}/finetune_roles_by_layer.png",
            caption="../report/pande_finetune_roles.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
        sep=report(
            "results/pande/{model}/finetune_sep_by_layer.png",
            caption="../report/pande_finetune_sep.rst",
            category="Heads hypothesis (Pande)",
            subcategory="{model}",
        ),
    log:
        "logs/pande_finetune_compare/{model}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../../scripts/pande_finetune.py"
