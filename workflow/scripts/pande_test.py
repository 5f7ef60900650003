"""Rule pande_test: the per head x role tests of one model, pooled over the analysed corpora
(with the stability of each label), and the same tests on each corpus alone."""

from headatlas.core.runner import setup
from headatlas.pande.analysis import model_table, write_table
from headatlas.pande.hypothesis import HypothesisSettings
from headatlas.report.html import write_tables_html

sm = snakemake
log = setup(sm)
settings = HypothesisSettings.from_config(sm.params.tests)
table, by_corpus = model_table(list(sm.input), sm.wildcards.model, settings, threads=sm.threads)
write_table(table, sm.output.heads)
write_table(by_corpus, sm.output.by_corpus)
write_tables_html(sm)  # the HTML page of each reported TSV
