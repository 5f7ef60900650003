"""Rule parse_corpus: dependency-parse a raw-text corpus with the packaged spaCy parser."""

from headatlas.core.data import load_records, write_records
from headatlas.core.io import atomic_path
from headatlas.core.parse import load_parser, parse_records, parser_info
from headatlas.core.runner import setup

sm = snakemake
log = setup(sm)
records = load_records(sm.input[0])
nlp = load_parser(sm.params.parser)
parsed = parse_records(records, nlp)
with atomic_path(sm.output[0]) as tmp:
    write_records(parsed, tmp)
log.info(
    "parsed %d records (%d words) of %s with %s",
    len(parsed),
    sum(len(r.words) for r in parsed),
    sm.input[0],
    parser_info(nlp),
)
