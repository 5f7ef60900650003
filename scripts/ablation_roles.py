"""Rule ablation_roles: each role ablated against matched random head sets; pruning curves, their figure and the
share of heads removable within a tolerance."""

import sys
import time

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.ablation.analysis import AblationSettings, ablate_roles  # noqa: E402
from headatlas.ablation.figures import pruning_figure  # noqa: E402
from headatlas.ablation.tasks import evaluations  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.device import job_device  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.models import ModelSpec  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
t0 = time.time()
settings = AblationSettings.from_config(sm.params.ablation)
spec = ModelSpec.from_config(sm.params.model)
tables = {
    k: pd.read_csv(sm.input[k], sep="\t")
    for k in ("pande", "behaviour", "syntax", "syntax_baselines")
    if k in sm.input.keys()
}
log.info("role tables: %s", sorted(tables) or "none")
heads = pd.read_csv(sm.input.heads, sep="\t")
evals, shape = evaluations(
    spec,
    sm.input.model[0] if sm.input.model else None,
    load_records(sm.input.corpus),
    sm.params.task,
    settings,
    device=job_device(spec.device, sm.resources.get("gpu")),
)
roles, pruning, removable = ablate_roles(spec.name, evals, heads, tables, settings)
for table, path in ((roles, sm.output.roles), (pruning, sm.output.pruning), (removable, sm.output.removable)):
    with atomic_path(path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
pruning_figure(pruning, spec.name, sm.output.figure, sm.output.svg)
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)  # the HTML page of each reported TSV
