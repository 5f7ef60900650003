"""Rule clark_gradient_figure: Clark et al. Fig. 3 from the gradient table."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.clark.figures import fig3_gradients  # noqa: E402
from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
table = pd.read_csv(sm.input[0], sep="\t", keep_default_na=True)
table["reason"] = table["reason"].fillna("")
save_figure(fig3_gradients(table, sm.wildcards.model, sm.wildcards.corpus), sm.output.png, sm.output.svg)
log.info("status %s", table["status"].iloc[0])
