"""Rule icl_figure: the FV AIE of every head beside its induction score."""

import pandas as pd

from headatlas.core.runner import setup
from headatlas.icl.figures import fv_figure

sm = snakemake
log = setup(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
detectors = pd.read_csv(sm.input.detectors, sep="\t") if "detectors" in sm.input.keys() else None
fv_figure(heads, detectors, sm.params.title, sm.output.png, sm.output.svg)
