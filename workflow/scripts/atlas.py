"""Rule atlas: join every analysis per head of one model; agreement between methods."""

from headatlas.atlas import analysis as at
from headatlas.atlas import columns
from headatlas.atlas.figures import agreement_figure, atlas_grid
from headatlas.core.integrity import read_table
from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
model, out = sm.wildcards.model, sm.output
with AttentionStore(sm.input.tokens) as store:
    n_layers, n_heads = store.n_layers, store.n_heads
tables = {k: read_table(sm.input[k]) if k in sm.input.keys() else None for k in at.TABLE_NAMES}
for k, table in tables.items():
    if table is not None:
        table.attrs["path"] = sm.input[k]  # errors of the join name the file
t = at.atlas_tables(model, n_layers, n_heads, tables, at.AtlasSettings.from_config(sm.params.atlas))
for key in ("atlas", "agreement", "relations", "profile"):
    write_tsv(t[key], out[key])
atlas_grid(t["atlas"], n_layers, n_heads, model, out.grid, out.grid_svg)
agreement_figure(t["scores"], t["agreement"], model, out.agreement_png, out.agreement_svg)
log.info(
    "atlas of %s: %d heads x %d columns; agreement:\n%s",
    model,
    len(t["atlas"]),
    t["atlas"].shape[1],
    t["agreement"].to_string(index=False),
)
# the HTML page of each reported TSV; the atlas's lists every column's description and unit (the column registry)
notes = {c: columns.describe(c).text() for c in t["atlas"].columns if c not in ("model", "layer", "head", "label")}
write_tables_html(sm, {str(out.atlas_html): notes})
