"""Rule ablation_roles: each role ablated against matched random head sets; pruning curves, their figure and the
share of heads removable within a tolerance."""

import time

import pandas as pd

from headatlas.ablation.analysis import AblationSettings, ablate_roles
from headatlas.ablation.figures import pruning_figure
from headatlas.ablation.tasks import evaluations
from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import model_job, setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
t0 = time.time()
settings = AblationSettings.from_config(sm.params.ablation)
spec, cache, device = model_job(sm)
tables = {
    k: pd.read_csv(sm.input[k], sep="\t")
    for k in ("pande", "behaviour", "syntax", "syntax_baselines")
    if k in sm.input.keys()
}
log.info("role tables: %s", sorted(tables) or "none")
heads = pd.read_csv(sm.input.heads, sep="\t")
evals, shape = evaluations(
    spec,
    cache,
    load_records(sm.input.corpus),
    sm.params.task,
    settings,
    device=device,
)
roles, pruning, removable = ablate_roles(spec.name, evals, heads, tables, settings)
for table, path in ((roles, sm.output.roles), (pruning, sm.output.pruning), (removable, sm.output.removable)):
    write_tsv(table, path)
pruning_figure(pruning, spec.name, sm.output.figure, sm.output.svg)
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)  # the HTML page of each reported TSV
