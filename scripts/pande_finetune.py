"""Rule pande_finetune_compare: roles and [SEP] attention per layer before and after fine-tuning."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.runner import setup  # noqa: E402
from headatlas.pande.analysis import finetune_comparison  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
summary = finetune_comparison(sm.input.base, sm.input.tuned, sm.input.model_dir, dict(sm.output))
log.info("summary %s", summary)
