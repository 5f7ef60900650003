"""Rule icl_agreement: the FV AIE against the induction, previous-token, sink and retrieval scores and the ablation."""

import pandas as pd

from headatlas.core.io import write_tsv
from headatlas.core.runner import setup
from headatlas.icl.analysis import agreement_table
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
heads = pd.read_csv(sm.input.heads, sep="\t")
atlas = pd.read_csv(sm.input.atlas, sep="\t")
table = agreement_table(heads, atlas, sm.params.top_k, sm.params.bootstrap, sm.params.seed)
for r in table.itertuples():
    log.info("FV AIE vs %s: spearman %.3f (%.3f-%.3f), top-%d overlap %d (chance %.2f)", r.score, r.spearman,
             r.ci_low, r.ci_high, r.top_k, r.top_k_overlap, r.top_k_chance)  # fmt: skip
write_tsv(table, sm.output.table)
write_tables_html(sm)
