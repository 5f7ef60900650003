"""Rule jomyaeng_figures: one model's heat maps, clustermap, category scatter and curves."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.core.runner import setup  # noqa: E402
from headatlas.jomyaeng.figures import all_figures  # noqa: E402

sm = snakemake  # noqa: F821
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
