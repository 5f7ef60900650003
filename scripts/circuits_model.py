"""Rule circuits_model: the per-head circuits table the atlas reads, the agreement between detectors, the figure."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.circuits.analysis import CircuitSettings, agreement, join_heads, read_table  # noqa: E402
from headatlas.circuits.figures import composition_figure  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
settings = CircuitSettings.from_config(sm.params.circuits)
get = lambda key: read_table(sm.input[key]) if key in sm.input.keys() else None  # noqa: E731
weights, long, detectors = get("weights"), get("long"), get("detectors")
model = str(weights["model"].iloc[0])
notes = [] if long is None else list(long.pop("circ_note").fillna("").astype(str).unique())
summary = get("induction")
if summary is not None and "status" in summary and summary["status"].iloc[0] == "skipped":
    notes.append(f"induction check: skipped: {summary['reason'].iloc[0]}")
heads = join_heads(weights, long, get("induction_heads"), summary, notes)
agree = agreement(heads, detectors, get("ablation"), model, settings)
for key, df in (("heads", heads), ("agreement", agree)):
    with atomic_path(sm.output[key]) as tmp:
        df.to_csv(tmp, sep="\t", index=False, float_format="%.5g")
composition_figure(get("pairs"), heads, detectors, model, settings.edges, sm.output.png, sm.output.svg)
log.info("model %s: agreement\n%s", model, agree.to_string())
write_tables_html(sm)
