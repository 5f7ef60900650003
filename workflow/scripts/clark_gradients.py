"""Rule clark_gradients: mean |dL/d attention| per layer and key type (Clark et al. Fig. 3).

A model without an LM head is skipped with a logged reason; its table says so."""

import time

from headatlas.clark.gradients import gradient_table
from headatlas.clark.surface import SurfaceSettings
from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import model_job, setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
g = SurfaceSettings.from_config(sm.params.surface).gradients
t0 = time.time()
spec, cache, device = model_job(sm)
table = gradient_table(
    spec,
    load_records(sm.input.corpus),
    cache_dir=cache,
    overflow=sm.params.overflow,
    n_segments=g.n_segments,
    mask_prob=g.mask_prob,
    seed=g.seed,
    batch_size=g.batch_size,
    device=device,
)
write_tsv(table, sm.output[0])
log.info("status %s, %.1f s", table["status"].iloc[0], time.time() - t0)
write_tables_html(sm)  # the HTML page of each reported TSV
