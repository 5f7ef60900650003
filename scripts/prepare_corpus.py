"""Rule prepare_corpus: build one corpus's records from the bundled files."""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.corpora import build_corpus  # noqa: E402
from headatlas.core.data import write_records  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.core.runner import setup  # noqa: E402

log = setup(snakemake)  # noqa: F821
name = snakemake.wildcards.corpus  # noqa: F821
skipped: list[str] = []
records = build_corpus(snakemake.params.spec, name, skipped)  # noqa: F821
for msg in skipped:
    log.warning("skipped (invalid_trees: skip): %s", msg)
with atomic_path(snakemake.output[0]) as tmp:  # noqa: F821
    n = write_records(records, tmp)
log.info(
    "corpus %s: %d records, %d words; %d sentences skipped as invalid trees",
    name,
    n,
    sum(len(r.words) for r in records),
    len(skipped),
)
