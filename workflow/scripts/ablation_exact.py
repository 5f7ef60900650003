"""Rule ablation_exact: exact ablation of one job's share of the heads known before the check (every head, or
the check's heads, of every ``exact_jobs``-th layer), gathered by rule ablation_heads."""

import time

from headatlas.ablation.analysis import AblationSettings, exact_part, write_exact_part
from headatlas.ablation.tasks import evaluations
from headatlas.core.data import load_records
from headatlas.core.runner import model_job, setup

sm = snakemake
log = setup(sm)
t0 = time.time()
settings = AblationSettings.from_config(sm.params.ablation)
spec, cache, device = model_job(sm)
evals, _ = evaluations(
    spec,
    cache,
    load_records(sm.input.corpus),
    sm.params.task,
    settings,
    device=device,
)
jobs, part = sm.params.jobs, sm.params.part
parts = {task: exact_part(ev, settings, jobs, part) if ev is not None else None for task, (ev, _) in evals.items()}
write_exact_part(sm.output[0], parts)
log.info("exact job %d of %d done in %.1f s wall, %.1f s CPU", part + 1, jobs, time.time() - t0, time.process_time())
