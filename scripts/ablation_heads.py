"""Rule ablation_heads: every head's ablation effect (exact, batched; or an estimate checked in every layer)."""

import sys
import time

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.ablation.analysis import AblationSettings, ablate_heads, read_exact_parts  # noqa: E402
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
evals, shape = evaluations(
    spec,
    sm.input.model[0] if sm.input.model else None,
    load_records(sm.input.corpus),
    sm.params.task,
    settings,
    device=job_device(spec.device, sm.resources.get("gpu")),
)
heads, check = ablate_heads(spec.name, evals, settings, shape, read_exact_parts(sm.input.exact))
for table, path in ((heads, sm.output.heads), (check, sm.output.check)):
    with atomic_path(path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("done in %.1f s wall, %.1f s CPU", time.time() - t0, time.process_time())
write_tables_html(sm)  # the HTML page of each reported TSV
