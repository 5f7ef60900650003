"""Rule prepare_corpus: build one corpus's records from the bundled files."""

from headatlas.core.corpora import build_corpus
from headatlas.core.data import write_records
from headatlas.core.io import atomic_path
from headatlas.core.runner import setup

log = setup(snakemake)
name = snakemake.wildcards.corpus
skipped: list[str] = []
records = build_corpus(snakemake.params.spec, name, skipped)
for msg in skipped:
    log.warning("skipped (invalid_trees: skip): %s", msg)
with atomic_path(snakemake.output[0]) as tmp:
    n = write_records(records, tmp)
log.info(
    "corpus %s: %d records, %d words; %d sentences skipped as invalid trees",
    name,
    n,
    sum(len(r.words) for r in records),
    len(skipped),
)
