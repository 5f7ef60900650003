"""Rule cache_model: dequantise a GGUF model once into an fp32 directory."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.models import ModelSpec, dequantize_gguf  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

log = setup(snakemake)  # noqa: F821
spec = ModelSpec.from_config(snakemake.params.model)  # noqa: F821
info = dequantize_gguf(spec, snakemake.output[0])  # noqa: F821
log.info("model %s: dequantised %s", spec.name, info)
