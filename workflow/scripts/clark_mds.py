"""Rule clark_mds: MDS of the head distances, within- vs between-layer distance, Fig. 6."""

import pandas as pd

from headatlas.clark.clustering import mds_tables
from headatlas.clark.figures import fig6_mds
from headatlas.clark.surface import SurfaceSettings
from headatlas.core.figures import save_figure
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
c = SurfaceSettings.from_config(sm.params.surface).clustering
heads, layers, stats = mds_tables(
    pd.read_csv(sm.input.distances, sep="\t"), pd.read_csv(sm.input.behaviour, sep="\t"), sm.wildcards.model,
    seed=c.seed, n_init=c.mds_n_init, max_iter=c.mds_max_iter, eps=c.mds_eps, permutations=c.permutations,
)  # fmt: skip
write_tsv(heads, sm.output.heads)
write_tsv(layers, sm.output.layers)
save_figure(fig6_mds(heads, sm.wildcards.model, sm.wildcards.corpus, stats), sm.output.png, sm.output.svg)
log.info(
    "within %.4f between %.4f p %.3g stress %.3g",
    stats["within_layer"],
    stats["between_layer"],
    stats["p_value"],
    layers["mds_stress"].iloc[0],
)
write_tables_html(sm)  # the HTML page of each reported TSV
