"""Rule cache_model: dequantise a GGUF model once into an fp32 directory."""

from headatlas.core.models import ModelSpec, dequantize_gguf
from headatlas.core.runner import setup

log = setup(snakemake)
spec = ModelSpec.from_config(snakemake.params.model)
info = dequantize_gguf(spec, snakemake.output[0])
log.info("model %s: dequantised %s", spec.name, info)
