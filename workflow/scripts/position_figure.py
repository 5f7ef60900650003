"""Rule position_figure: where in a long input do heads look (one line per layer, by query position)."""

import pandas as pd

from headatlas.core.figures import save_figure
from headatlas.core.runner import setup
from headatlas.position.figures import position_figure

sm = snakemake
log = setup(sm)
fig = position_figure(pd.read_csv(sm.input[0], sep="\t"), sm.params.title)
save_figure(fig, sm.output.png, sm.output.svg)
log.info("wrote %s", sm.output.png)
