"""Rule icl_exclusion: Yin & Steinhardt's exclusion test, FV heads against induction heads, each mean-ablated."""

import time

import pandas as pd

from headatlas.core.io import head_shape, write_tsv
from headatlas.core.runner import model_job, setup
from headatlas.icl.analysis import IclSettings, load_decoder
from headatlas.icl.exclusion import ExclusionSettings, exclusion_table, skip_reason, skipped_table
from headatlas.icl.tasks import FILE_TASKS, task_pairs
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
t0 = time.time()
icl = IclSettings.from_config(sm.params.icl)
settings = ExclusionSettings.from_config(sm.params.exclusion)
spec, cache, device = model_job(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
detectors = pd.read_csv(sm.input.detectors, sep="\t") if "detectors" in sm.input.keys() else None
L, H = head_shape(heads)
reason = skip_reason(heads, detectors)
if not reason:
    loaded, reason, (L, H) = load_decoder(spec, cache, device)
if reason:
    log.warning("model %s: skipped: %s", spec.name, reason)
    table = skipped_table(spec.name, reason)
else:
    files = {t: getattr(sm.input, t) for t in FILE_TASKS if t in icl.tasks}
    pairs = task_pairs(list(icl.tasks), list(sm.input.ewt), files)
    table = exclusion_table(
        spec.name, loaded, pairs, heads, detectors, sm.input.text, icl, settings, L, H, spec.max_length
    )
write_tsv(table, sm.output.table)
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)
