def surface_targets():
    return expand(
        "results/surface/{model}/{corpus}.tsv",
        model=MODELS,
        corpus=config["analysis"]["surface"]["corpora"],
    )


TARGET_FUNCTIONS.append(surface_targets)


rule surface_stats:
    input:
        lambda wc: shard_dirs(wc.model, wc.corpus),
    output:
        report(
            "results/surface/{model}/{corpus}.tsv",
            caption="../report/surface.rst",
            category="Surface patterns",
            subcategory="{model}",
        ),
    log:
        "logs/surface_stats/{model}/{corpus}.log",
    conda:
        "../../envs/headatlas.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        smoothing=config["analysis"]["surface"]["smoothing"],
    script:
        "../../scripts/surface_stats.py"
