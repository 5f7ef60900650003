"""Rule pande_length: sieve score against sequence length (strongest and median heads per role, per corpus)."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.runner import setup  # noqa: E402
from headatlas.pande.analysis import length_analysis  # noqa: E402

sm = snakemake  # noqa: F821
log = setup(sm)
out = {k: sm.output[k] for k in ("table", "trend", "figure", "figure_svg")}
trend = length_analysis(list(sm.input.scores), sm.input.heads, out, n_bins=sm.params.bins, top=sm.params.heads)
log.info(
    "Spearman correlation of sentence score with length over heads, per corpus and role:\n%s",
    trend.to_string(index=False),
)
