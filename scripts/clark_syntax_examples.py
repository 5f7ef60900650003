"""Rule clark_syntax_examples: Fig. 5-style panels of the best syntactic heads and the coreference head."""

import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.syntax_figures import coref_example, plot_examples, syntax_example  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.figures import save_figure  # noqa: E402
from headatlas.core.runner import as_dirs as dirs  # noqa: E402
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821


log = setup(sm)
p = sm.params
best = pd.read_csv(sm.input.relations, sep="\t").set_index("relation")
panels = []
records = load_records(sm.input.syntax_corpus)
with AttentionStore(dirs(sm.input.syntax_maps)) as store:
    for rel in p.relations:
        if rel not in best.index:
            log.info("relation %s: not among the reported relations; no panel", rel)
            continue
        b = best.loc[rel]
        panels.append(
            syntax_example(
                store, records, rel, int(b["layer"]), int(b["head"]), b["direction"], p.max_words, p.word_mode
            )
        )
t2 = pd.read_csv(sm.input.table2, sep="\t")
t2 = t2[t2["scored_on"] == "all"].set_index("system")
records = load_records(sm.input.coref_corpus)
with AttentionStore(dirs(sm.input.coref_maps)) as store:
    panels.append(
        coref_example(
            store, records, int(t2.loc["Best head", "layer"]), int(t2.loc["Best head", "head"]), mode=p.word_mode
        )
    )
save_figure(plot_examples(panels, sm.wildcards.model), sm.output.png, sm.output.svg)
log.info("%d panels (%d without an example)", sum(x is not None for x in panels), sum(x is None for x in panels))
