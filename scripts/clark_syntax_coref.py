"""Rule clark_syntax_coref: antecedent selection accuracy of every head and of the baselines (Clark Table 2)."""

import sys
import time
from itertools import chain

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.coref import BASELINES, baseline_table, collect, head_table, store_items, table2  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import as_dirs as dirs, setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821


log = setup(sm)
p = sm.params
t0 = time.time()
stores = {split: AttentionStore(dirs(sm.input[f"{split}_maps"])) for split in p.splits}
records = {split: load_records(sm.input[f"{split}_corpus"]) for split in p.splits}
first = next(iter(stores.values()))
model = first.meta["model"]
items = chain.from_iterable(store_items(stores[s], records[s], s, p.word_mode) for s in p.splits)
res = collect(items, first.n_layers, first.n_heads)
for s in stores.values():
    s.close()
kept = {s: int(sum(stores[s].n_words)) for s in p.splits}
log.info("%s: %d anaphors, words kept per split %s, %d anaphor heads without pieces (%.1f s)", model, len(res.heads), kept, res.n_no_pieces, time.time() - t0)
t2 = table2(res, model, p.bootstrap, p.seed)
best = t2[(t2["system"] == "Best head") & (t2["scored_on"] == "all")].iloc[0]
k = int(best["layer"]) * res.n_heads + int(best["head"])
an = res.anaphors
anaphors = pd.DataFrame(
    {"model": model, "doc": an.doc, "split": an.split, "type": an.kind, "head": an.head, "n_candidates": [len(c) for c in an.candidates]}
)
for b, name in enumerate(BASELINES):
    anaphors[name] = res.baselines[:, b]
anaphors["best_head"] = res.heads[:, k]
outputs = {"heads": head_table(res, model), "baselines": baseline_table(res, model), "anaphors": anaphors, "table2": t2}
for key, frame in outputs.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("table 2:\n%s", t2.to_string(index=False))
