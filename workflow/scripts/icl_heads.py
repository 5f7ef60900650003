"""Rule icl_heads: ICL task accuracy and every head's function-vector AIE (exact, or checked estimates)."""

import time

from headatlas.core.io import write_tsv
from headatlas.core.runner import model_job, setup
from headatlas.icl.analysis import IclSettings, icl_tables, load_decoder, skipped_tables
from headatlas.icl.tasks import FILE_TASKS, task_pairs
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
t0 = time.time()
settings = IclSettings.from_config(sm.params.icl)
spec, cache, device = model_job(sm)
loaded, reason, (L, H) = load_decoder(spec, cache, device)
if loaded is None:
    log.warning("model %s: skipped: %s", spec.name, reason)
    tables = skipped_tables(spec.name, reason, list(settings.tasks), L, H)
else:
    files = {t: getattr(sm.input, t) for t in FILE_TASKS if t in settings.tasks}
    pairs = task_pairs(list(settings.tasks), list(sm.input.ewt), files)
    tables = icl_tables(spec.name, *loaded, pairs, settings, L, H)
for table, path in zip(tables, (sm.output.tasks, sm.output.heads, sm.output.check)):
    write_tsv(table, path)
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)
