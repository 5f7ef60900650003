"""Rule clark_examples: line diagrams of the strongest head of each behaviour (Clark et al. Fig. 1)."""

import pandas as pd

from headatlas.clark.figures import examples_figure
from headatlas.clark.surface import SurfaceSettings
from headatlas.core.figures import save_figure
from headatlas.core.io import write_tsv
from headatlas.core.reduce import map_dirs
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore

sm = snakemake
log = setup(sm)
settings = SurfaceSettings.from_config(sm.params.surface).examples
with AttentionStore(map_dirs(list(sm.input.maps), "Fig. 1 examples")) as store:  # a fused corpus: its sample's maps
    table, fig = examples_figure(
        store, pd.read_csv(sm.input.behaviour, sep="\t"), sm.wildcards.model, sm.wildcards.corpus, settings
    )
write_tsv(table, sm.output.table)
save_figure(fig, sm.output.png, sm.output.svg)
log.info(
    "sequence %s, heads %s",
    table[["sequence", "n_tokens"]].drop_duplicates().to_dict("records"),
    table[["behaviour", "layer", "head"]].values.tolist(),
)
