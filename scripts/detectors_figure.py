"""Rule detectors_figure: the detector grids and sink shares of one model."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.runner import setup  # noqa: E402
from headatlas.detectors.figures import detector_figure  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
sinks = pd.read_csv(sm.input.sinks, sep="\t")
detector_figure(heads, sinks, sm.wildcards.model, sm.output.png, sm.output.svg)
