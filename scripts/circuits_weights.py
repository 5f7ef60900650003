"""Rule circuits_weights: composition, copying and successor scores of one model from its weights (no data)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.circuits.analysis import CircuitSettings, weights_tables  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.models import ModelSpec, lm_head_model, load, model_kind, resolve  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
spec = ModelSpec.from_config(sm.params.model)
settings = CircuitSettings.from_config(sm.params.circuits)
cache = sm.input.model[0] if sm.input.model else None
model, tokenizer, config = load(spec, cache_dir=cache, device="cpu")
loc, kwargs = resolve(spec, cache)
lm_model, reason = lm_head_model(loc, model_kind(config, spec), kwargs)
tables = weights_tables(lm_model.base_model if lm_model is not None else model, lm_model, reason, tokenizer,
                        spec.name, settings)  # fmt: skip
for key in ("pairs", "summary", "heads", "tokens"):
    with atomic_path(sm.output[key]) as tmp:
        tables[key].to_csv(tmp, sep="\t", index=False, float_format="%.5g")
log.info("model %s: composition summary\n%s", spec.name, tables["summary"].to_string())
write_tables_html(sm)
