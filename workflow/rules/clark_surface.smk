from headatlas.clark.surface import SurfaceSettings
from headatlas.core.settings import settings_params

CLARK = analysis_section("clark_surface", "../schemas/clark_surface.schema.yaml")

# Fig. 1 draws its example from the stored maps (a maps: sample corpus: from its sample); not on long_corpora
for _c in CLARK["corpora"] if analysis_active("clark_surface") else []:
    if _c in CORPUS_MAPS and CORPUS_MAPS[_c][0] == "none":
        raise ValueError(
            f"config key corpora.{_c}.maps: none, but analysis.clark_surface draws Fig. 1 from its maps; "
            "set maps: sample (or full)"
        )

CLARK_FILES = [
    "surface.tsv",
    "behaviour.tsv",
    "fig2_surface.png",
    "fig4_entropy.png",
    "gradients.tsv",
    "fig3_gradients.png",
    "js_distance.tsv",
    "mds.tsv",
    "layer_clustering.tsv",
    "fig6_mds.png",
    "examples.tsv",
    "fig1_examples.png",
    "headlines.tsv",
]
# long_corpora: the per-head surface statistics only (map-free; JS clustering, gradients and Fig. 1 do not scale)
CLARK_LONG_FILES = [
    "surface.tsv",
    "behaviour.tsv",
    "fig2_surface.png",
    "fig4_entropy.png",
]


register_targets(
    "clark_surface",
    lambda: [
        f"results/clark/{m}/{c}/{name}"
        for m in analysis_models("clark_surface")
        for c in analysis_corpora("clark_surface", m)
        for name in CLARK_FILES
    ]
    + [
        f"results/clark/{m}/{c}/{name}"
        for m in analysis_models("clark_surface")
        for c in CLARK["long_corpora"]
        if c in model_corpora(m)
        for name in CLARK_LONG_FILES
    ],
)


rule clark_surface_stats:
    input:
        lambda wc: shard_dirs(wc.model, wc.corpus),
    output:
        "results/clark/{model}/{corpus}/surface.tsv",
        html=report(
            "results/clark/{model}/{corpus}/surface.html",
            caption="../report/clark_surface.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Sec. 3 surface statistics per head ({corpus}; table)"},
        ),
    log:
        "logs/clark_surface_stats/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_surface_stats/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        surface=settings_params(SurfaceSettings, CLARK, "smoothing"),
    script:
        "../scripts/clark_surface_stats.py"


rule clark_behaviour:
    input:
        "results/clark/{model}/{corpus}/surface.tsv",
    output:
        "results/clark/{model}/{corpus}/behaviour.tsv",
        html=report(
            "results/clark/{model}/{corpus}/behaviour.html",
            caption="../report/clark_behaviour.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 6 behaviour label per head ({corpus}; table)"},
        ),
    log:
        "logs/clark_behaviour/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_behaviour/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        surface=settings_params(
            SurfaceSettings,
            CLARK,
            "broad_entropy",
            "offset_threshold",
            "special_threshold",
        ),
    script:
        "../scripts/clark_behaviour.py"


rule clark_surface_figures:
    input:
        "results/clark/{model}/{corpus}/surface.tsv",
    output:
        fig2=report(
            "results/clark/{model}/{corpus}/fig2_surface.png",
            caption="../report/clark_fig2.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={
                "item": "Fig. 2 attention to special tokens and offsets ({corpus})"
            },
        ),
        fig2_svg="results/clark/{model}/{corpus}/fig2_surface.svg",
        fig4=report(
            "results/clark/{model}/{corpus}/fig4_entropy.png",
            caption="../report/clark_fig4.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 4 attention entropy ({corpus})"},
        ),
        fig4_svg="results/clark/{model}/{corpus}/fig4_entropy.svg",
    log:
        "logs/clark_surface_figures/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_surface_figures/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        surface=settings_params(SurfaceSettings, CLARK, "broad_entropy"),
    script:
        "../scripts/clark_surface_figures.py"


rule clark_gradients:
    input:
        corpus="results/corpora/{corpus}.jsonl.gz",
        model=model_cache,
    output:
        "results/clark/{model}/{corpus}/gradients.tsv",
        html=report(
            "results/clark/{model}/{corpus}/gradients.html",
            caption="../report/clark_gradients.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 3 gradient importance ({corpus}; table)"},
        ),
    log:
        "logs/clark_gradients/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_gradients/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: CLARK["gradients"]["threads"]
    resources:
        mem_mb=model_mem_mb(6000),
        runtime=60,
        gpu=lambda wc: uses_gpu(wc.model),
    params:
        model=lambda wc: MODELS[wc.model],
        overflow=lambda wc: CORPORA[wc.corpus].get("overflow", EXTRACTION["overflow"]),
        surface=settings_params(SurfaceSettings, CLARK, "gradients"),
    script:
        "../scripts/clark_gradients.py"


rule clark_gradient_figure:
    input:
        "results/clark/{model}/{corpus}/gradients.tsv",
    output:
        png=report(
            "results/clark/{model}/{corpus}/fig3_gradients.png",
            caption="../report/clark_gradients.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 3 gradient importance ({corpus})"},
        ),
        svg="results/clark/{model}/{corpus}/fig3_gradients.svg",
    log:
        "logs/clark_gradient_figure/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_gradient_figure/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/clark_gradient_figure.py"


rule clark_js_distances:
    input:
        lambda wc: shard_dirs(wc.model, wc.corpus),
    output:
        "results/clark/{model}/{corpus}/js_distance.tsv",
    log:
        "logs/clark_js_distances/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_js_distances/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        surface=settings_params(
            SurfaceSettings,
            CLARK,
            "clustering.n_segments",
            "clustering.smoothing",
            "clustering.max_elements",
            "clustering.max_heads",
            "clustering.seed",
        ),
    script:
        "../scripts/clark_js_distances.py"


rule clark_mds:
    input:
        distances="results/clark/{model}/{corpus}/js_distance.tsv",
        behaviour="results/clark/{model}/{corpus}/behaviour.tsv",
    output:
        heads="results/clark/{model}/{corpus}/mds.tsv",
        heads_html=report(
            "results/clark/{model}/{corpus}/mds.html",
            caption="../report/clark_mds.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 6 MDS coordinates per head ({corpus}; table)"},
        ),
        layers="results/clark/{model}/{corpus}/layer_clustering.tsv",
        layers_html=report(
            "results/clark/{model}/{corpus}/layer_clustering.html",
            caption="../report/clark_mds.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={
                "item": "Fig. 6 within- vs between-layer distance ({corpus}; table)"
            },
        ),
        png=report(
            "results/clark/{model}/{corpus}/fig6_mds.png",
            caption="../report/clark_mds.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 6 MDS of heads ({corpus})"},
        ),
        svg="results/clark/{model}/{corpus}/fig6_mds.svg",
    log:
        "logs/clark_mds/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_mds/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    params:
        surface=settings_params(
            SurfaceSettings,
            CLARK,
            "clustering.seed",
            "clustering.mds_n_init",
            "clustering.mds_max_iter",
            "clustering.mds_eps",
            "clustering.permutations",
        ),
    script:
        "../scripts/clark_mds.py"


rule clark_examples:
    input:
        maps=lambda wc: shard_dirs(wc.model, wc.corpus),
        behaviour="results/clark/{model}/{corpus}/behaviour.tsv",
    output:
        table="results/clark/{model}/{corpus}/examples.tsv",
        png=report(
            "results/clark/{model}/{corpus}/fig1_examples.png",
            caption="../report/clark_examples.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Fig. 1 example heads ({corpus})"},
        ),
        svg="results/clark/{model}/{corpus}/fig1_examples.svg",
    log:
        "logs/clark_examples/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_examples/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    params:
        surface=settings_params(SurfaceSettings, CLARK, "examples"),
    script:
        "../scripts/clark_examples.py"


rule clark_headlines:
    input:
        behaviour="results/clark/{model}/{corpus}/behaviour.tsv",
        layers="results/clark/{model}/{corpus}/layer_clustering.tsv",
        gradients="results/clark/{model}/{corpus}/gradients.tsv",
    output:
        "results/clark/{model}/{corpus}/headlines.tsv",
        html=report(
            "results/clark/{model}/{corpus}/headlines.html",
            caption="../report/clark_headlines.rst",
            category="Clark et al. 2019",
            subcategory="{model}",
            labels={"item": "Claims of the paper vs this model ({corpus}; table)"},
        ),
    log:
        "logs/clark_headlines/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/clark_headlines/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        surface=settings_params(SurfaceSettings, CLARK, "broad_entropy"),
    script:
        "../scripts/clark_headlines.py"
