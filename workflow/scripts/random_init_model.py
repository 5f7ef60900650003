"""Rule random_init_model: a config model re-initialised except its word/position embeddings."""

from headatlas.core.models import ModelSpec, random_init_model
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
p = sm.params.random_init
base = ModelSpec.from_config(p["base"])
info = random_init_model(base, sm.input.base[0] if sm.input.base else None, p["seed"], sm.output[0])
log.info("model %s: random init of %s with seed %d, kept %s", sm.wildcards.model, base.name, p["seed"], info["kept"])
