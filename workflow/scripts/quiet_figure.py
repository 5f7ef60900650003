"""Rule quiet_figure: the positional, dormant and rigid head grids and the massive activations of one model."""

import pandas as pd

from headatlas.core.runner import setup
from headatlas.quiet.figures import quiet_figure

sm = snakemake
log = setup(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
layers = pd.read_csv(sm.input.layers, sep="\t")
quiet_figure(heads, layers, sm.wildcards.model, sm.output.png, sm.output.svg)
