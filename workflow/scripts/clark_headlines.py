"""Rule clark_headlines: Clark et al.'s headline claims beside this model's analogues."""

import pandas as pd

from headatlas.clark.surface import SurfaceSettings, clark_headlines
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
behaviour = pd.read_csv(sm.input.behaviour, sep="\t")
clustering = pd.read_csv(sm.input.layers, sep="\t").iloc[0].to_dict()
gradients = pd.read_csv(sm.input.gradients, sep="\t")
table = clark_headlines(behaviour, clustering, gradients, SurfaceSettings.from_config(sm.params.surface).broad_entropy)
table.insert(0, "model", sm.wildcards.model)
write_tsv(table, sm.output[0], float_format="%.4g")
log.info("%s", table[["claim", "measured", "holds"]].to_string())
write_tables_html(sm)  # the HTML page of each reported TSV
