"""Rule ablation_heads: every head's ablation effect (exact, batched; or an estimate checked in every layer)."""

import time

from headatlas.ablation.analysis import AblationSettings, ablate_heads, read_exact_parts
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
evals, shape = evaluations(
    spec,
    cache,
    load_records(sm.input.corpus),
    sm.params.task,
    settings,
    device=device,
)
heads, check = ablate_heads(spec.name, evals, settings, shape, read_exact_parts(sm.input.exact))
for table, path in ((heads, sm.output.heads), (check, sm.output.check)):
    write_tsv(table, path)
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)  # the HTML page of each reported TSV
