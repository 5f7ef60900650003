"""Rule detectors: every detector of one model on natural and seeded random inputs (fused; no maps stored)."""

from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.models import load
from headatlas.core.runner import model_job, setup
from headatlas.detectors.analysis import run_detectors
from headatlas.detectors.sequences import DetectorSettings
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, device = model_job(sm)
settings = DetectorSettings.from_config(sm.params.detectors)
model, tokenizer, config = load(spec, cache_dir=cache, device=device)
corpora = {name: load_records(path) for name, path in zip(sm.params.corpora, sm.input.corpora)}
tables = run_detectors(spec, model, tokenizer, config, corpora, settings)
for key in ("heads", "sinks", "kv_groups", "kv_summary", "inputs"):
    write_tsv(tables[key], sm.output[key])
h = tables["heads"]
log.info(
    "model %s: %d sequences; significant heads (FDR) per input x detector:\n%s",
    spec.name,
    len(tables["inputs"]),
    h.groupby(["input", "detector"])["significant"].sum().unstack().to_string(),
)
write_tables_html(sm)  # the HTML page of each reported TSV
