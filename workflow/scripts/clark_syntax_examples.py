"""Rule clark_syntax_examples: Fig. 5-style panels of the best syntactic heads and the coreference head."""

import pandas as pd

from headatlas.clark.syntax_figures import example_panels, plot_examples
from headatlas.core.data import load_records
from headatlas.core.figures import save_figure
from headatlas.core.reduce import map_dirs
from headatlas.core.runner import as_dirs as dirs
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore

sm = snakemake
log = setup(sm)
p = sm.params
with (  # a corpus with maps: sample: its sample's maps
    AttentionStore(map_dirs(dirs(sm.input.syntax_maps), "Fig. 5 examples")) as syntax,
    AttentionStore(map_dirs(dirs(sm.input.coref_maps), "Fig. 5 examples")) as coref,
):
    panels = example_panels(
        pd.read_csv(sm.input.relations, sep="\t"),
        pd.read_csv(sm.input.table2, sep="\t"),
        (syntax, load_records(sm.input.syntax_corpus)),
        (coref, load_records(sm.input.coref_corpus)),
        p.relations,
        max_words=p.max_words,
        mode=p.word_mode,
    )
save_figure(plot_examples(panels, sm.wildcards.model), sm.output.png, sm.output.svg)
log.info("%d panels (%d without an example)", sum(x is not None for x in panels), sum(x is None for x in panels))
