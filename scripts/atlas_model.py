"""Rule atlas: join every analysis per head of one model; agreement between methods."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.atlas import analysis as at  # noqa: E402
from headatlas.atlas.figures import agreement_figure, atlas_grid  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
p = sm.params.atlas
model = sm.wildcards.model
with AttentionStore(sm.input.tokens) as store:
    n_layers, n_heads = store.n_layers, store.n_heads
tables = {k: pd.read_csv(sm.input[k], sep="\t") if k in sm.input.keys() else None for k in at.TABLE_NAMES}
atlas = at.build_atlas(model, n_layers, n_heads, tables)
k = p["top_k"] or n_heads
scores = at.method_scores(atlas, tables["syntax"], p["relations"])
agreement = at.agreement_table(scores, model, k, p["bootstrap"], p["seed"])
relations = at.relation_heads_vs_sieve(atlas, tables["syntax"], p["relations"], k, model) if tables["syntax"] is not None else pd.DataFrame()
profile = at.layer_profiles(atlas, n_layers)
profile.insert(0, "model", model)
out = sm.output
for df, path in ((atlas, out.atlas), (agreement, out.agreement), (relations, out.relations), (profile, out.profile)):
    with atomic_path(path) as tmp:
        df.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
atlas_grid(atlas, n_layers, n_heads, model, out.grid, out.grid_svg)
agreement_figure(scores, agreement, model, out.agreement_png)
log.info("atlas of %s: %d heads x %d columns; agreement:\n%s", model, len(atlas), atlas.shape[1], agreement.to_string(index=False))
