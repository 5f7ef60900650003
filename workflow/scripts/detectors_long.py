"""Rule detectors_long: every detector of one model on the inputs of one long corpus, each as long as its `tokens`
(the model spec's max_length, checked against the model's positions before the weights load; fused, map-free where
the model allows, no maps stored)."""

from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.models import load
from headatlas.core.runner import model_job, setup
from headatlas.detectors.analysis import run_detectors
from headatlas.detectors.sequences import DetectorSettings, LongDetectorSettings
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, device = model_job(sm)
settings = DetectorSettings.from_config(sm.params.detectors)
long = LongDetectorSettings.from_config(sm.params.long)
model, tokenizer, config = load(spec, cache_dir=cache, device=device)
corpora = {sm.wildcards.corpus: load_records(sm.input.corpus)}
tables = run_detectors(spec, model, tokenizer, config, corpora, settings, long)
for key in ("heads", "sinks", "kv_groups", "kv_summary", "inputs"):
    write_tsv(tables[key], sm.output[key])
log.info(
    "model %s, corpus %s: %d sequences of up to %d tokens; significant heads (FDR) per input x detector:\n%s",
    spec.name,
    sm.wildcards.corpus,
    len(tables["inputs"]),
    spec.max_length,
    tables["heads"].groupby(["input", "detector"])["significant"].sum().unstack().to_string(),
)
write_tables_html(sm)  # the HTML page of each reported TSV
