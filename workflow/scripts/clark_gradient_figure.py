"""Rule clark_gradient_figure: Clark et al. Fig. 3 from the gradient table."""

import pandas as pd

from headatlas.clark.figures import fig3_gradients
from headatlas.core.figures import save_figure
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
table = pd.read_csv(sm.input[0], sep="\t", keep_default_na=True)
table["reason"] = table["reason"].astype(object).fillna("")  # all-empty reads as float: no fill warning
save_figure(fig3_gradients(table, sm.wildcards.model, sm.wildcards.corpus), sm.output.png, sm.output.svg)
log.info("status %s", table["status"].iloc[0])
