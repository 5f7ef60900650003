"""Readers for the bundled corpora. Each returns a list of :class:`Record`.

- CoNLL-U with gold trees (UD English EWT, GUM/OntoGUM); multi-word token lines
  (``3-4``) and empty nodes (``8.1``) are skipped; OntoGUM coreference brackets in
  MISC (``Entity=(12``, ``12)``, ``(12)``) become mentions.
- Clark-style Wikipedia segments from WikiText-2: two consecutive paragraphs as a pair.
- Tab-separated sentence pairs (SICK) and labelled sentences (SST-2).
- Records already in headatlas's JSON-lines format (written by another rule, e.g. a task generator).
"""

from __future__ import annotations

import gzip
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from .data import Record, load_records

_ENTITY = re.compile(r"\(\d+\)|\(\d+|\d+\)")


class CorpusError(ValueError):
    """Malformed corpus input; the message names the file and line."""


@dataclass
class ConlluSentence:
    sent_id: str
    doc: str
    words: list[str] = field(default_factory=list)
    head: list[int] = field(default_factory=list)  # 1-based, 0 = ROOT, as in the file
    deprel: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)
    lemma: list[str] = field(default_factory=list)
    feats: list[str] = field(default_factory=list)
    entity: list[str] = field(default_factory=list)  # raw Entity= value per word, "" if none


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_conllu(path: str | Path) -> list[ConlluSentence]:
    """Parse a CoNLL-U file into sentences of syntactic words.

    Raises CorpusError naming ``path:line`` for a malformed line.
    """
    path = Path(path)
    sentences: list[ConlluSentence] = []
    doc = ""
    cur: ConlluSentence | None = None
    sent_id = ""

    def finish(lineno: int) -> None:
        nonlocal cur
        if cur is not None and cur.words:
            n = len(cur.words)
            for i, h in enumerate(cur.head):
                if not 0 <= h <= n:
                    raise CorpusError(f"{path}:{lineno}: sentence {cur.sent_id!r}: word {i + 1} has HEAD {h} outside 0..{n}")
            sentences.append(cur)
        cur = None

    with _open_text(path) as fh:
        lineno = 0
        for lineno, raw in enumerate(fh, 1):
            line = raw.rstrip("\n")
            if not line.strip():
                finish(lineno)
                continue
            if line.startswith("#"):
                m = re.match(r"#\s*newdoc id\s*=\s*(.+)", line)
                if m:
                    doc = m.group(1).strip()
                m = re.match(r"#\s*sent_id\s*=\s*(.+)", line)
                if m:
                    sent_id = m.group(1).strip()
                continue
            cols = line.split("\t")
            if len(cols) != 10:
                raise CorpusError(f"{path}:{lineno}: expected 10 tab-separated columns, found {len(cols)}")
            tid = cols[0]
            if "-" in tid or "." in tid:  # multi-word token or empty node
                if not re.fullmatch(r"\d+-\d+|\d+\.\d+", tid):
                    raise CorpusError(f"{path}:{lineno}: bad token ID {tid!r}")
                continue
            if not tid.isdigit():
                raise CorpusError(f"{path}:{lineno}: bad token ID {tid!r}")
            if cur is None:
                cur = ConlluSentence(sent_id=sent_id or f"{path.name}:{lineno}", doc=doc)
                sent_id = ""
            if int(tid) != len(cur.words) + 1:
                raise CorpusError(f"{path}:{lineno}: token ID {tid} out of order (expected {len(cur.words) + 1})")
            try:
                head = int(cols[6])
            except ValueError:
                raise CorpusError(f"{path}:{lineno}: HEAD {cols[6]!r} is not an integer") from None
            cur.words.append(cols[1])
            cur.lemma.append(cols[2])
            cur.upos.append(cols[3])
            cur.xpos.append(cols[4])
            cur.feats.append(cols[5])
            cur.head.append(head)
            cur.deprel.append(cols[7])
            ent = ""
            for item in cols[9].split("|"):
                if item.startswith("Entity="):
                    ent = item[len("Entity=") :]
            cur.entity.append(ent)
        finish(lineno + 1)
    return sentences


def parse_mentions(entities: list[str], where: str = "") -> list[tuple[int, int, int]]:
    """Turn per-word bracket strings into (first, last, cluster) mentions, sorted by position."""
    open_: dict[int, list[int]] = {}
    mentions = []
    for i, ent in enumerate(entities):
        if not ent:
            continue
        for tok in _ENTITY.findall(ent):
            if tok.startswith("(") and tok.endswith(")"):
                mentions.append((i, i, int(tok[1:-1])))
            elif tok.startswith("("):
                open_.setdefault(int(tok[1:]), []).append(i)
            else:
                c = int(tok[:-1])
                if not open_.get(c):
                    raise CorpusError(f"{where}: word {i + 1}: closing bracket {tok!r} without an opening one")
                mentions.append((open_[c].pop(), i, c))
    left = [c for c, v in open_.items() if v]
    if left:
        raise CorpusError(f"{where}: unclosed mention brackets for clusters {left}")
    return sorted(mentions)


def sentence_records(sentences: list[ConlluSentence]) -> list[Record]:
    """One record per sentence, heads converted to 0-based (-1 = ROOT)."""
    return [
        Record(
            id=s.sent_id,
            words=tuple(s.words),
            segment=(0,) * len(s.words),
            sentence=(0,) * len(s.words),
            head=tuple(h - 1 for h in s.head),
            deprel=tuple(s.deprel),
            upos=tuple(s.upos),
            xpos=tuple(s.xpos),
            lemma=tuple(s.lemma),
            feats=tuple(s.feats),
            doc=s.doc,
        )
        for s in sentences
    ]


def document_records(sentences: list[ConlluSentence], path: str = "", max_words: int = 0) -> list[Record]:
    """One record per document (``# newdoc``), with coreference mentions.

    ``max_words`` > 0 keeps only the first words of each document (mentions that
    cross the cut are dropped); model-level truncation happens at extraction.
    """
    docs: dict[str, list[ConlluSentence]] = {}
    for s in sentences:
        docs.setdefault(s.doc, []).append(s)
    records = []
    for doc, sents in docs.items():
        words, head, deprel, upos, xpos, lemma, feats, ent, sent = [], [], [], [], [], [], [], [], []
        for k, s in enumerate(sents):
            off = len(words)
            words += s.words
            head += [h - 1 + off if h > 0 else -1 for h in s.head]
            deprel += s.deprel
            upos += s.upos
            xpos += s.xpos
            lemma += s.lemma
            feats += s.feats
            ent += s.entity
            sent += [k] * len(s.words)
        mentions = parse_mentions(ent, where=f"{path} document {doc!r}")
        if max_words and len(words) > max_words:
            n = max_words
            words, deprel, upos, xpos, lemma, feats, sent = (x[:n] for x in (words, deprel, upos, xpos, lemma, feats, sent))
            head = [h if h < n else -1 for h in head[:n]]
            mentions = [m for m in mentions if m[1] < n]
        records.append(
            Record(
                id=doc or f"{path}:doc{len(records)}",
                words=tuple(words),
                segment=(0,) * len(words),
                sentence=tuple(sent),
                head=tuple(head),
                deprel=tuple(deprel),
                upos=tuple(upos),
                xpos=tuple(xpos),
                lemma=tuple(lemma),
                feats=tuple(feats),
                mentions=tuple(mentions),
                doc=doc,
            )
        )
    return records


# --- WikiText-2 -----------------------------------------------------------------

_WIKI_JOINERS = {"@-@": "-", "@,@": ",", "@.@": "."}


def wikitext_articles(path: str | Path) -> list[list[list[str]]]:
    """Articles as lists of paragraphs of words; headers dropped, ``@-@`` joiners undone."""
    articles: list[list[list[str]]] = []
    with _open_text(Path(path)) as fh:
        for line in fh:
            s = line.strip()
            if not s:
                continue
            if s.startswith("= ") and s.endswith(" ="):
                if not s.startswith("= = "):
                    articles.append([])
                continue
            if not articles:
                articles.append([])
            words: list[str] = []
            glue = False
            for w in s.split():
                if w in _WIKI_JOINERS:
                    if words:
                        words[-1] += _WIKI_JOINERS[w]
                        glue = True
                    continue
                if glue and words:
                    words[-1] += w
                else:
                    words.append(w)
                glue = False
            if words:
                articles[-1].append(words)
    return [a for a in articles if a]


def wiki_segments(path: str | Path, n_segments: int, max_words: int, seed: int) -> list[Record]:
    """Clark-style segments: two consecutive paragraphs of one article as an A/B pair.

    Each paragraph is cut to at most ``max_words // 2`` words (from a random side, as
    Clark's ``preprocess_unlabeled.py`` truncates randomly); ``n_segments`` pairs are
    drawn without replacement with ``random.Random(seed)``.
    """
    if max_words < 2:
        raise ValueError(f"max_words must be at least 2, got {max_words}")
    rng = random.Random(seed)
    articles = wikitext_articles(path)
    candidates = [(a, p) for a, art in enumerate(articles) for p in range(len(art) - 1)]
    if not candidates:
        raise CorpusError(f"{path}: no pair of consecutive paragraphs found")
    picks = rng.sample(candidates, min(n_segments, len(candidates)))
    half = max_words // 2
    records = []
    for a, p in picks:
        parts = []
        for para in (articles[a][p], articles[a][p + 1]):
            if len(para) > half:
                start = rng.randint(0, len(para) - half)
                para = para[start : start + half]
            parts.append(para)
        words = parts[0] + parts[1]
        records.append(
            Record(
                id=f"wiki-a{a}-p{p}",
                words=tuple(words),
                segment=(0,) * len(parts[0]) + (1,) * len(parts[1]),
                sentence=(0,) * len(parts[0]) + (1,) * len(parts[1]),
            )
        )
    return records


# --- TSV tasks ------------------------------------------------------------------


def tsv_records(path: str | Path, text_columns: int, label_column: int | None, limit: int = 0, prefix: str = "") -> list[Record]:
    """Whitespace-tokenised sentences (one text column) or pairs (two) from a TSV file."""
    path = Path(path)
    records = []
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            need = text_columns + (0 if label_column is None else 1)
            if len(cols) < need:
                raise CorpusError(f"{path}:{lineno}: expected at least {need} tab-separated columns, found {len(cols)}")
            parts = [cols[i].split() for i in range(text_columns)]
            if any(not p for p in parts):
                raise CorpusError(f"{path}:{lineno}: empty sentence")
            words = [w for p in parts for w in p]
            segment = [k for k, p in enumerate(parts) for _ in p]
            label = cols[label_column].strip() if label_column is not None else ""
            records.append(
                Record(
                    id=f"{prefix or path.stem}-{lineno}",
                    words=tuple(words),
                    segment=tuple(segment),
                    sentence=tuple(segment),
                    label=label,
                )
            )
            if limit and len(records) >= limit:
                break
    return records


def build_corpus(spec: dict, name: str = "") -> list[Record]:
    """Build the records of one corpus from its config entry."""
    kind = spec["kind"]
    paths = spec["paths"] if "paths" in spec else [spec["path"]]
    records: list[Record] = []
    for p in paths:
        if kind == "conllu":
            records += sentence_records(read_conllu(p))
        elif kind == "conllu_documents":
            records += document_records(read_conllu(p), path=str(p), max_words=spec.get("max_words", 0))
        elif kind == "wikitext":
            records += wiki_segments(p, spec["n_segments"], spec["max_words"], spec["seed"])
        elif kind == "records":
            records += load_records(p)
        elif kind == "tsv":
            records += tsv_records(p, spec["text_columns"], spec.get("label_column"), prefix=f"{name}-{Path(p).stem}")
        else:
            raise CorpusError(f"corpus {name!r}: unknown kind {kind!r}")
    limit = spec.get("limit", 0)
    if limit and kind != "wikitext":
        records = records[:limit]
    if not records:
        raise CorpusError(f"corpus {name!r}: no records in {', '.join(map(str, paths))}")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise CorpusError(f"corpus {name!r}: duplicate record ids")
    return records
