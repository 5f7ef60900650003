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
    params:
        smoothing=config["analysis"]["surface"]["smoothing"],
    log:
        "logs/surface_stats/{model}/{corpus}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../../envs/headatlas.yaml"
    script:
        "../../scripts/surface_stats.py"
