"""Rule circuits_causal: the induction check (mean-ablated previous-token heads) and the long-input scores
(retrieval, long-range echo and induction) of one causal model; an encoder's tables say why they are skipped."""

import pandas as pd

from headatlas.circuits import analysis as A
from headatlas.circuits.induction import InductionSettings
from headatlas.circuits.longrange import LongSettings
from headatlas.core.io import write_tsv
from headatlas.core.models import lm_head_model, load, resolve
from headatlas.core.runner import model_job, setup
from headatlas.detectors.sequences import DetectorSettings
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, device = model_job(sm)
settings = A.CircuitSettings.from_config(sm.params.circuits)
common = {k: sm.params.circuits[k] for k in ("bootstrap", "ci", "seed")}
ind_settings = InductionSettings.from_config({**sm.params.induction, **common})
long = LongSettings.from_config({**sm.params.long, "seed": settings.seed})
kind, config = A.model_kind_only(spec, cache)
n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
detectors = A.read_table(sm.input.detectors) if "detectors" in sm.input.keys() else None
lm_model, reason = None, f"{kind}: not a causal model"
if kind == "decoder":
    loc, kwargs = resolve(spec, cache)
    lm_model, reason = lm_head_model(loc, kind, kwargs, spec, device)  # on device, or split by its device_map
if lm_model is None:
    summary, per_head = A.skipped(spec.name, reason), pd.DataFrame()
    tables = A.long_skipped(spec.name, n_layers, n_heads, reason)
else:
    # the causal tests run on the LM model's own base model: the weights held once, in its float32
    model, tokenizer, config = load(spec, cache_dir=cache, device=device, model=lm_model.base_model)
    if not sm.params.induction_active or detectors is None:
        why = (
            "off"
            if not sm.params.induction_active
            else "analysis.detectors does not cover the model (the check reads its heads and inputs)"
        )
        summary, per_head = A.skipped(spec.name, why), pd.DataFrame()
    else:
        det = DetectorSettings.from_config(sm.params.detectors)
        pairs = A.read_table(sm.input.pairs)
        summary, per_head = A.induction_check(spec, model, tokenizer, config, detectors, pairs, det, ind_settings)
    if sm.params.long_active:
        with open(sm.input.haystack, encoding="utf-8") as fh:
            text = fh.read()
        tables = A.long_inputs(spec, lm_model, model, tokenizer, config, text, long, detectors, settings, log)
    else:
        tables = A.long_skipped(spec.name, n_layers, n_heads, "analysis.circuits.long.activate is false")
tables["heads"]["circ_note"] = tables["note"]
outputs = {
    "summary": summary,
    "per_head": per_head,
    **{k: tables[k] for k in ("runs", "heads", "bins", "sets", "window")},
}
for key, df in outputs.items():
    write_tsv(df, sm.output[key], float_format="%.5g")
log.info("model %s: induction check\n%s\n%s", spec.name, summary.T.to_string(), per_head.to_string())
log.info("model %s: long inputs\n%s\n%s\n%s", spec.name, tables["bins"].to_string(), tables["sets"].to_string(),
         tables["window"].to_string())  # fmt: skip
write_tables_html(sm)
