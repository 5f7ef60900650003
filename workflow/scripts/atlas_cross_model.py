"""Rule atlas_cross_model: role shares, probing and detector profiles of every model on relative depth, and the
models side by side (one row per model: the ladder)."""

import pandas as pd

from headatlas.atlas.analysis import ladder_table
from headatlas.atlas.figures import cross_model_figures
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
models = sm.params.models


def read(paths) -> dict[str, pd.DataFrame]:
    return {m: pd.read_csv(path, sep="\t") for m, path in zip(models, paths)}


profiles = read(sm.input.profiles)
write_tsv(pd.concat(profiles.values(), ignore_index=True), sm.output.table)
ladder = ladder_table(read(sm.input.atlases), read(sm.input.agreements))
write_tsv(ladder, sm.output.ladder)
figures = ("pande", "clark", "probing", "detectors")
cross_model_figures(profiles, {k: sm.output[k] for f in figures for k in (f, f + "_svg")})
write_tables_html(sm)
log.info("cross-model profiles of %s; the ladder:\n%s", ", ".join(models), ladder.to_string(index=False))
