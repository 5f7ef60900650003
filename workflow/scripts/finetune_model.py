"""Rule finetune_model: fine-tune a config model on a bundled task into a derived model."""

import json

from headatlas.core.device import job_device
from headatlas.core.finetune import finetune
from headatlas.core.models import ModelSpec
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
p = sm.params.finetune
base = ModelSpec.from_config(p["base"])
device = job_device(base.device, sm.resources.get("gpu"))
metrics = finetune(
    base, sm.input.base[0] if sm.input.base else None, p["task"], sm.output[0], threads=sm.threads, device=device
)
log.info("fine-tuned %s on %s: %s", base.name, p["task"]["name"], json.dumps(metrics))
