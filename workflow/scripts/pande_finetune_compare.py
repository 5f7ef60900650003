"""Rule pande_finetune_compare: roles and [SEP] attention per layer before and after fine-tuning."""

from headatlas.core.runner import setup
from headatlas.pande.analysis import finetune_comparison

sm = snakemake
log = setup(sm)
summary = finetune_comparison(sm.input.base, sm.input.tuned, sm.input.model_dir, dict(sm.output))
log.info("summary %s", summary)
