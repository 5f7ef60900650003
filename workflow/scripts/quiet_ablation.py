"""Rule quiet_ablation: the next-token loss effect of zero-ablating every head of one model, one head at a time, on
the quiet analysis's natural inputs (exact and batched where affordable, else the checked estimate)."""

from headatlas.core.data import load_records
from headatlas.core.io import write_tsv
from headatlas.core.runner import model_job, setup
from headatlas.quiet.analysis import QuietSettings, zero_ablation
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
spec, cache, device = model_job(sm)
settings = QuietSettings.from_config(sm.params.quiet)
corpora = {name: load_records(path) for name, path in zip(sm.params.corpora, sm.input.corpora)}
zero, check = zero_ablation(spec, cache, corpora, settings, device)
write_tsv(zero, sm.output.zero)
write_tsv(check, sm.output.check)
kinds = zero["quiet_zero_effect_kind"].value_counts().to_dict()
exact = zero["quiet_zero_effect_kind"] == "exact"
log.info(
    "model %s: zero-ablation kinds %s; CI holds 0 for %d of the %d heads ablated exactly",
    spec.name,
    kinds,
    int(zero.loc[exact, "quiet_zero_null"].astype(bool).sum()),
    int(exact.sum()),
)
write_tables_html(sm)
