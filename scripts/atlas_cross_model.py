"""Rule atlas_cross_model: role shares and probing profiles of every model on relative depth."""

import pandas as pd

from headatlas.atlas.figures import cross_model_figures
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
profiles = {m: pd.read_csv(path, sep="\t") for m, path in zip(sm.params.models, sm.input)}
table = pd.concat(profiles.values(), ignore_index=True)
write_tsv(table, sm.output.table)
cross_model_figures(profiles, {k: sm.output[k] for k in sm.output.keys() if k != "table"})
log.info("cross-model profiles of %s", ", ".join(profiles))
