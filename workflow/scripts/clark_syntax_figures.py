"""Rule clark_syntax_figures: figures of Tables 1 and 2 and per-head accuracy maps."""

import pandas as pd

from headatlas.clark.syntax_figures import plot_coref_heads, plot_head_grid, plot_table1, plot_table2
from headatlas.core.figures import save_figure
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
model = sm.wildcards.model
t1 = pd.read_csv(sm.input.table1, sep="\t")
heads = pd.read_csv(sm.input.syntax_heads, sep="\t")
corpus = sm.params.syntax_corpus
coref = " + ".join(sm.params.coref_corpora.values())
save_figure(plot_table1(t1, model, corpus), sm.output.table1, sm.output.table1_svg)
relations = ["All"] + [r for r in dict.fromkeys(t1.loc[t1["n"] > 0, "relation"]) if r != "All"]
save_figure(plot_head_grid(heads, relations, model, corpus), sm.output.heads, sm.output.heads_svg)
save_figure(plot_table2(pd.read_csv(sm.input.table2, sep="\t"), model, coref), sm.output.table2, sm.output.table2_svg)
save_figure(
    plot_coref_heads(pd.read_csv(sm.input.coref_heads, sep="\t"), model, coref),
    sm.output.coref_heads,
    sm.output.coref_heads_svg,
)
log.info("%s: figures for %d relations", model, len(relations))
