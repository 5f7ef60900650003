"""Rule circuits_model: the per-head circuits table the atlas reads, the agreement between detectors, the figure."""

from headatlas.circuits.analysis import CircuitSettings, agreement, join_heads, read_table
from headatlas.circuits.figures import composition_figure
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
settings = CircuitSettings.from_config(sm.params.circuits)
get = lambda key: read_table(sm.input[key]) if key in sm.input.keys() else None
weights, long, detectors = get("weights"), get("long"), get("detectors")
model = str(weights["model"].iloc[0])
notes = [] if long is None else list(long.pop("circ_note").astype(object).fillna("").astype(str).unique())
summary = get("induction")
if summary is not None and "status" in summary and summary["status"].iloc[0] == "skipped":
    notes.append(f"induction check: skipped: {summary['reason'].iloc[0]}")
heads = join_heads(weights, long, get("induction_heads"), summary, notes)
agree = agreement(heads, detectors, get("ablation"), model, settings)
for key, df in (("heads", heads), ("agreement", agree)):
    write_tsv(df, sm.output[key], float_format="%.5g")
composition_figure(get("pairs"), heads, detectors, model, settings.edges, sm.output.png, sm.output.svg)
log.info("model %s: agreement\n%s", model, agree.to_string())
write_tables_html(sm)
