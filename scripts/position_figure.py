"""Rule position_figure: where in a long input do heads look (one line per layer, by query position)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.position import position_figure  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
fig = position_figure(pd.read_csv(sm.input[0], sep="\t"), sm.params.title)
save_figure(fig, sm.output.png, sm.output.svg)
log.info("wrote %s", sm.output.png)
