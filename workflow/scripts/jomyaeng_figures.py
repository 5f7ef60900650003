"""Rule jomyaeng_figures: one model's heat maps, clustermap, category scatter and curves."""

import pandas as pd

from headatlas.core.runner import setup
from headatlas.jomyaeng.figures import all_figures

sm = snakemake
log = setup(sm)
tables = {k: pd.read_csv(sm.input[k], sep="\t") for k in ("heads", "layers", "topn", "summary")}
out = {k: sm.output[k] for k in sm.output.keys()}
all_figures(
    tables["heads"],
    tables["layers"],
    tables["topn"],
    tables["summary"],
    out,
    sm.wildcards.model,
    sm.params.probing,
    sm.params.downstream,
)
log.info("model %s: %d figures", sm.wildcards.model, len(out))
