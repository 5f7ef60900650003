"""Rule detectors_long_figure: the detector grids and sink shares of one model on one long corpus."""

import pandas as pd

from headatlas.core.runner import setup
from headatlas.detectors.figures import detector_figure

sm = snakemake
log = setup(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
sinks = pd.read_csv(sm.input.sinks, sep="\t")
detector_figure(heads, sinks, f"{sm.wildcards.model}, {sm.wildcards.corpus}", sm.output.png, sm.output.svg)
