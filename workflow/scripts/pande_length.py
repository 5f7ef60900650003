"""Rule pande_length: sieve score against sequence length (strongest and median heads per role, per corpus)."""

from headatlas.core.runner import setup
from headatlas.pande.analysis import length_analysis

sm = snakemake
log = setup(sm)
out = {k: sm.output[k] for k in ("table", "trend", "figure", "figure_svg")}
trend = length_analysis(list(sm.input.scores), sm.input.heads, out, n_bins=sm.params.bins, top=sm.params.heads)
log.info(
    "Spearman correlation of sentence score with length over heads, per corpus and role:\n%s",
    trend.to_string(index=False),
)
