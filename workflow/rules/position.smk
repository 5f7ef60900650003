from headatlas.core.settings import settings_params
from headatlas.position.reducers import PositionSettings

POSITION = analysis_section("position", "../schemas/position.schema.yaml")

register_targets(
    "position",
    lambda: [
        f"results/position/{m}/{c}/{name}"
        for m in analysis_models("position")
        for c in analysis_corpora("position", m)
        for name in ("position.tsv", "position.png")
    ],
)


rule position_stats:
    input:
        lambda wc: shard_dirs(wc.model, wc.corpus),
    output:
        "results/position/{model}/{corpus}/position.tsv",
    log:
        "logs/position_stats/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/position_stats/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        position=settings_params(PositionSettings, POSITION),
    script:
        "../scripts/position_stats.py"


rule position_figure:
    input:
        "results/position/{model}/{corpus}/position.tsv",
    output:
        png="results/position/{model}/{corpus}/position.png",
        svg="results/position/{model}/{corpus}/position.svg",
    log:
        "logs/position_figure/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/position_figure/{model}/{corpus}.tsv"
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        title=lambda wc: f"{wc.model} on {wc.corpus}",
    script:
        "../scripts/position_figure.py"
