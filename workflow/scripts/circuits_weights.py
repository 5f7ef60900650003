"""Rule circuits_weights: composition, copying and successor scores of one model from its weights (no data)."""

from headatlas.circuits.analysis import CircuitSettings, weights_tables
from headatlas.core.io import write_tsv
from headatlas.core.models import lm_head_model, load, model_kind, resolve, unsplit
from headatlas.core.runner import model_job, setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, _ = model_job(sm)  # the weight scores run on the CPU
settings = CircuitSettings.from_config(sm.params.circuits)
model, tokenizer, config = load(unsplit(spec), cache_dir=cache, device="cpu")  # reads every weight
loc, kwargs = resolve(spec, cache)
lm_model, reason = lm_head_model(loc, model_kind(config, spec), kwargs)
tables = weights_tables(lm_model.base_model if lm_model is not None else model, lm_model, reason, tokenizer,
                        spec.name, settings)  # fmt: skip
for key in ("pairs", "summary", "heads", "tokens"):
    write_tsv(tables[key], sm.output[key], float_format="%.5g")
log.info("model %s: composition summary\n%s", spec.name, tables["summary"].to_string())
write_tables_html(sm)
