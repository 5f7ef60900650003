"""Rule clark_syntax_heads: every head as a dependency parser, best heads and offset baselines (Clark Table 1)."""

import sys
import time

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.clark.syntax import HeadSettings, store_correctness, syntax_tables  # noqa: E402
from headatlas.core.data import load_records  # noqa: E402
from headatlas.core.html import write_tables_html  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import as_dirs as dirs  # noqa: E402
from headatlas.core.runner import setup
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821


log = setup(sm)
p = sm.params
settings = HeadSettings.from_config(p.heads)
t0 = time.time()
records = load_records(sm.input.data_corpus)
with AttentionStore(dirs(sm.input.data_maps)) as store:
    model = store.meta["model"]
    c = store_correctness(store, records, settings)
log.info(
    "%s on %s: %d dependents in %d sentences, %d words without pieces (%.1f s)",
    model,
    p.corpus,
    len(c.relation),
    len(store),
    c.n_missing,
    time.time() - t0,
)
outputs = syntax_tables(c, model, settings)
for key, frame in outputs.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
log.info("best heads:\n%s", outputs["relations"].to_string(index=False))
write_tables_html(sm)  # the HTML page of each reported TSV
