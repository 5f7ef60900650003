"""Rule atlas_cross_model: role shares and probing profiles of every model on relative depth."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

import pandas as pd  # noqa: E402

from headatlas.atlas.analysis import JM_CATEGORIES, PANDE_ROLES_MAIN  # noqa: E402
from headatlas.atlas.figures import cross_model_figure  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
profiles = {m: pd.read_csv(path, sep="\t") for m, path in zip(sm.params.models, sm.input)}
table = pd.concat(profiles.values(), ignore_index=True)
with atomic_path(sm.output.table) as tmp:
    table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
behaviours = sorted({c for p in profiles.values() for c in p.columns if c.startswith("share_behaviour_")})
figures = {
    "pande": ([(f"share_{r}", f"{r} (FDR)") for r in PANDE_ROLES_MAIN], "Pande roles: share of heads per layer", "share of the layer's heads"),
    "clark": ([(c, c.replace("share_behaviour_", "Clark: ")) for c in behaviours], "Clark behaviour labels: share of heads per layer", "share of the layer's heads"),
    "probing": ([(f"probe_{c}", f"{c} tasks") for c in JM_CATEGORIES], "Jo & Myaeng probing: mean head accuracy per layer", "mean test accuracy"),
}
for family, (columns, title, ylabel) in figures.items():
    cross_model_figure(profiles, columns, title, ylabel, sm.output[family])
log.info("cross-model profiles of %s", ", ".join(profiles))
