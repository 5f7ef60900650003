"""Rule clark_surface_figures: Clark et al. Fig. 2 (surface patterns) and Fig. 4 (entropy)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.clark.figures import fig2_surface, fig4_entropy  # noqa: E402
from headatlas.clark.surface import SurfaceSettings  # noqa: E402
from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
table = pd.read_csv(sm.input[0], sep="\t")
model, corpus = sm.wildcards.model, sm.wildcards.corpus
settings = SurfaceSettings.from_config(sm.params.surface)
save_figure(fig2_surface(table, model, corpus), sm.output.fig2, sm.output.fig2_svg)
save_figure(fig4_entropy(table, model, corpus, settings.broad_entropy), sm.output.fig4, sm.output.fig4_svg)
log.info("figures for %d heads", len(table))
