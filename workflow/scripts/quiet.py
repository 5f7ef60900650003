"""Rule quiet: positional, dormant and rigid head statistics and the massive activations of one model on natural
text (fused, map-free where the model allows; no maps stored)."""

from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.models import load
from headatlas.core.runner import model_job, setup
from headatlas.quiet.analysis import QuietSettings, run_quiet
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, device = model_job(sm)
settings = QuietSettings.from_config(sm.params.quiet)
model, tokenizer, config = load(spec, cache_dir=cache, device=device)
corpora = {name: load_records(path) for name, path in zip(sm.params.corpora, sm.input.corpora)}
tables = run_quiet(spec, model, tokenizer, config, corpora, settings)
for key in ("stats", "massive", "layers"):
    write_tsv(tables[key], sm.output[key])
s, layers = tables["stats"], tables["layers"]
log.info(
    "model %s: %d sequences; positional heads %d; massive activations at the first token in layers %s",
    spec.name,
    int(s["n_sequences"].iloc[0]),
    int(s["quiet_positional_head"].sum()),
    (layers.loc[layers["massive_first_share"] > 0, "layer"] + 1).tolist(),
)
write_tables_html(sm)  # the HTML page of each reported TSV
