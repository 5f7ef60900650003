include: "clark_syntax_common.smk"


register_targets("clark_syntax", clark_targets)


rule clark_syntax_relation_map:
    output:
        "results/clark/relation_map.tsv",
        html=report(
            "results/clark/relation_map.html",
            caption="../report/clark_syntax_relation_map.rst",
            category="Clark et al. 2019",
            subcategory="all models",
            labels={"item": "Table 1 relations: Stanford Dependencies to UD (table)"},
        ),
    log:
        "logs/clark_syntax_relation_map.log",
    benchmark:
        "results/benchmarks/clark_syntax_relation_map.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    script:
        "../scripts/clark_syntax_relation_map.py"


rule clark_syntax_heads:
    input:
        unpack(clark_split_inputs({"data": CLARK_SYNTAX["syntax_corpus"]})),
    output:
        heads="results/clark/{model}/syntax/heads.tsv",
        baselines="results/clark/{model}/syntax/baselines.tsv",
        relations="results/clark/{model}/syntax/relations.tsv",
        table1="results/clark/{model}/syntax/table1.tsv",
        table1_html=report(
            "results/clark/{model}/syntax/table1.html",
            caption="../report/clark_syntax_table1.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 1 best head per relation (EWT; table)"},
        ),
    log:
        "logs/clark_syntax_heads/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_heads/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        corpus=CLARK_SYNTAX["syntax_corpus"],
        heads=settings_params(HeadSettings, CLARK_SYNTAX),
    script:
        "../scripts/clark_syntax_heads.py"


rule clark_syntax_coref:
    input:
        unpack(clark_split_inputs(CLARK_SYNTAX["coref_corpora"])),
    output:
        heads="results/clark/{model}/coref/heads.tsv",
        baselines="results/clark/{model}/coref/baselines.tsv",
        anaphors="results/clark/{model}/coref/anaphors.tsv",
        table2="results/clark/{model}/coref/table2.tsv",
        table2_html=report(
            "results/clark/{model}/coref/table2.html",
            caption="../report/clark_syntax_table2.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 2 coreference (OntoGUM; table)"},
        ),
    log:
        "logs/clark_syntax_coref/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_coref/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=20,
    params:
        splits=CLARK_SYNTAX["coref_corpora"],
        coref=settings_params(CorefSettings, CLARK_SYNTAX),
    script:
        "../scripts/clark_syntax_coref.py"


rule clark_syntax_probe:
    input:
        unpack(
            clark_split_inputs(
                {"train": CLARK_SYNTAX["probe_train"], **CLARK_SYNTAX["probe_eval"]}
            )
        ),
    output:
        uas="results/clark/{model}/probes/uas.tsv",
        weights="results/clark/{model}/probes/attn_weights.tsv",
        history="results/clark/{model}/probes/history.tsv",
    log:
        "logs/clark_syntax_probe/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_probe/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: CLARK_SYNTAX["probe"]["threads"]
    resources:
        mem_mb=6000,
        runtime=60,
    params:
        eval_splits=list(CLARK_SYNTAX["probe_eval"]),
        word_mode=CLARK_SYNTAX["word_mode"],
        probe=settings_params(ProbeSettings, CLARK_SYNTAX["probe"]),
    script:
        "../scripts/clark_syntax_probe.py"


rule clark_syntax_table3:
    input:
        unpack(clark_table3_inputs),
    output:
        table="results/clark/{model}/probes/table3.tsv",
        table_html=report(
            "results/clark/{model}/probes/table3.html",
            caption="../report/clark_syntax_table3.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 3 attention-based parsing probes (EWT; table)"},
        ),
        png=report(
            "results/clark/{model}/probes/table3.png",
            caption="../report/clark_syntax_table3.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 3 attention-based parsing probes (EWT)"},
        ),
        svg="results/clark/{model}/probes/table3.svg",
    log:
        "logs/clark_syntax_table3/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_table3/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        random_model=lambda wc: clark_random_model(wc.model),
    script:
        "../scripts/clark_syntax_table3.py"


rule clark_syntax_figures:
    input:
        table1="results/clark/{model}/syntax/table1.tsv",
        syntax_heads="results/clark/{model}/syntax/heads.tsv",
        table2="results/clark/{model}/coref/table2.tsv",
        coref_heads="results/clark/{model}/coref/heads.tsv",
    output:
        table1=report(
            "results/clark/{model}/syntax/table1.png",
            caption="../report/clark_syntax_table1.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 1 best head per relation (EWT)"},
        ),
        table1_svg="results/clark/{model}/syntax/table1.svg",
        heads=report(
            "results/clark/{model}/syntax/heads.png",
            caption="../report/clark_syntax_heads.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={
                "item": "Table 1 accuracy of every head per relation, layers x heads (EWT)"
            },
        ),
        heads_svg="results/clark/{model}/syntax/heads.svg",
        table2=report(
            "results/clark/{model}/coref/table2.png",
            caption="../report/clark_syntax_table2.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Table 2 coreference (OntoGUM)"},
        ),
        table2_svg="results/clark/{model}/coref/table2.svg",
        coref_heads=report(
            "results/clark/{model}/coref/heads.png",
            caption="../report/clark_syntax_coref_heads.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={
                "item": "Table 2 coreference accuracy of every head, layers x heads (OntoGUM)"
            },
        ),
        coref_heads_svg="results/clark/{model}/coref/heads.svg",
    log:
        "logs/clark_syntax_figures/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_figures/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        syntax_corpus=CLARK_SYNTAX["syntax_corpus"],
        coref_corpora=CLARK_SYNTAX["coref_corpora"],
    script:
        "../scripts/clark_syntax_figures.py"


rule clark_syntax_examples:
    input:
        unpack(
            clark_split_inputs(
                {
                    "syntax": CLARK_SYNTAX["syntax_corpus"],
                    "coref": next(iter(CLARK_SYNTAX["coref_corpora"].values())),
                }
            )
        ),
        relations="results/clark/{model}/syntax/relations.tsv",
        table2="results/clark/{model}/coref/table2.tsv",
    output:
        png=report(
            "results/clark/{model}/examples/fig5.png",
            caption="../report/clark_syntax_examples.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 5 example syntactic and coreference heads"},
        ),
        svg="results/clark/{model}/examples/fig5.svg",
    log:
        "logs/clark_syntax_examples/{model}.log",
    benchmark:
        "results/benchmarks/clark_syntax_examples/{model}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        relations=CLARK_SYNTAX["examples"]["relations"],
        max_words=CLARK_SYNTAX["examples"]["max_words"],
        word_mode=CLARK_SYNTAX["word_mode"],
    script:
        "../scripts/clark_syntax_examples.py"
