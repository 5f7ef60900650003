"""Rule clark_surface_figures: Clark et al. Fig. 2 (surface patterns) and Fig. 4 (entropy)."""

import pandas as pd

from headatlas.clark.figures import fig2_surface, fig4_entropy
from headatlas.clark.surface import SurfaceSettings
from headatlas.core.figures import save_figure
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
table = pd.read_csv(sm.input[0], sep="\t")
model, corpus = sm.wildcards.model, sm.wildcards.corpus
settings = SurfaceSettings.from_config(sm.params.surface)
save_figure(fig2_surface(table, model, corpus), sm.output.fig2, sm.output.fig2_svg)
save_figure(fig4_entropy(table, model, corpus, settings.broad_entropy), sm.output.fig4, sm.output.fig4_svg)
log.info("figures for %d heads", len(table))
