"""Readers for the bundled corpora. Each returns a list of :class:`Record`.

- CoNLL-U with gold trees (UD English EWT, GUM/OntoGUM); multi-word token lines
  (``3-4``) and empty nodes (``8.1``) are skipped; OntoGUM coreference brackets in
  MISC (``Entity=(12``, ``12)``, ``(12)``) become mentions. Every sentence must be a
  dependency tree (:func:`tree_problem`).
- Clark-style Wikipedia segments from WikiText-2: two consecutive paragraphs as a pair.
- Long Wikipedia segments (``wikitext_long``): running text of one article, cut by extraction
  to ``tokens`` tokens (whole words: a few tokens fewer when a word would cross the limit).
- Tab-separated sentence pairs (SICK) and labelled sentences (SST-2).
- Records already in headatlas's JSON-lines format (written by another rule, e.g. a task generator).

Every error is a CorpusError naming the file and line (a byte that is not UTF-8 included).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .data import CorpusError, Record, load_records, read_lines

_ENTITY = re.compile(r"\(\d+\)|\(\d+|\d+\)")
INVALID_TREES = ("error", "skip")


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


def tree_problem(head) -> tuple[int, str] | None:
    """The first defect of a dependency tree, as (0-based word index, what), or None for a tree.

    ``head`` is 1-based per word, 0 = ROOT (as in CoNLL-U). Checked in this order: heads in
    0..n, no word its own head, exactly one root, every word reaches the root (no cycle).
    """
    h = np.asarray(head, dtype=np.int64)
    n = len(h)
    bad = np.flatnonzero((h < 0) | (h > n))
    if bad.size:
        return int(bad[0]), f"word {bad[0] + 1} has HEAD {h[bad[0]]} outside 0..{n}"
    loop = np.flatnonzero(h == np.arange(1, n + 1))
    if loop.size:
        return int(loop[0]), f"word {loop[0] + 1} is its own head"
    roots = np.flatnonzero(h == 0)
    if roots.size == 0:
        return 0, "no root (no word has HEAD 0)"
    if roots.size > 1:
        return int(
            roots[1]
        ), f"{roots.size} roots (words {', '.join(str(r + 1) for r in roots)} have HEAD 0); a tree has exactly one"
    up = np.concatenate([[0], h])  # up[i] = head of word i (1-based), up[0] = 0
    for _ in range(int(np.ceil(np.log2(n + 1))) + 1):  # pointer jumping: 2^k >= n + 1 steps up
        up = up[up]
    stuck = np.flatnonzero(up[1:])  # words that never reach the root
    if stuck.size:
        cycle, w = [], int(up[stuck[0] + 1])  # after n steps up, a word on the cycle
        while w not in cycle:
            cycle.append(w)
            w = int(h[w - 1])
        first = min(cycle)
        k = cycle.index(first)
        cycle = cycle[k:] + cycle[:k]
        return (
            first - 1,
            f"cycle {' -> '.join(map(str, cycle + [first]))} (words {', '.join(str(i + 1) for i in stuck)} do not reach the root)",
        )
    return None


def read_conllu(
    path: str | Path, invalid_trees: str = "error", skipped: list[str] | None = None
) -> list[ConlluSentence]:
    """Parse a CoNLL-U file into sentences of syntactic words.

    Raises CorpusError naming ``path:line`` for a malformed line. Every sentence must be a
    tree (:func:`tree_problem`); a sentence that is not raises CorpusError naming the line of
    the offending word and the sentence id, or with ``invalid_trees="skip"`` is left out and
    its message appended to ``skipped``.
    """
    if invalid_trees not in INVALID_TREES:
        raise ValueError(f"invalid_trees must be one of {INVALID_TREES}, got {invalid_trees!r}")
    path = Path(path)
    sentences: list[ConlluSentence] = []
    doc = ""
    cur: ConlluSentence | None = None
    lines: list[int] = []  # line number of each word of cur
    sent_id = ""

    def finish() -> None:
        nonlocal cur
        if cur is not None and cur.words:
            problem = tree_problem(cur.head)
            if problem is None:
                sentences.append(cur)
            else:
                msg = f"{path}:{lines[problem[0]]}: sentence {cur.sent_id!r} is not a tree: {problem[1]}"
                if invalid_trees == "error":
                    raise CorpusError(msg)
                if skipped is not None:
                    skipped.append(msg)
        cur = None
        lines.clear()

    for lineno, raw in enumerate(read_lines(path), 1):
        line = raw.rstrip("\n")
        if not line.strip():
            finish()
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
        lines.append(lineno)
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
    finish()
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
            words, deprel, upos, xpos, lemma, feats, sent = (
                x[:n] for x in (words, deprel, upos, xpos, lemma, feats, sent)
            )
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
    for line in read_lines(path):
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


def wiki_long_segments(path: str | Path, n_segments: int, tokens: int, seed: int) -> list[Record]:
    """Long single-segment inputs: windows of ``tokens`` consecutive words of one article's running
    text (paragraphs joined, headers dropped), non-overlapping; ``n_segments`` drawn without
    replacement with ``random.Random(seed)``, in article order.

    Every word is at least one token, so a window holds at least ``tokens`` tokens: extraction
    truncates each to ``tokens`` (the corpus sets the models' ``max_length``), in whole words, so an
    input may be a few tokens shorter when a word's pieces would cross the limit."""
    if tokens < 2:
        raise ValueError(f"tokens must be at least 2, got {tokens}")
    articles = wikitext_articles(path)
    runs = [[w for para in art for w in para] for art in articles]
    candidates = [(a, s) for a, words in enumerate(runs) for s in range(0, len(words) - tokens + 1, tokens)]
    if not candidates:
        raise CorpusError(f"{path}: no article has {tokens} words of running text (config key tokens)")
    picks = sorted(random.Random(seed).sample(candidates, min(n_segments, len(candidates))))
    records = []
    for a, start in picks:
        # paragraph index of each word: the record's sentence ids
        para = np.repeat(np.arange(len(articles[a])), [len(p) for p in articles[a]])[start : start + tokens]
        records.append(
            Record(
                id=f"wikilong-a{a}-w{start}",
                words=tuple(runs[a][start : start + tokens]),
                segment=(0,) * tokens,
                sentence=tuple((para - para[0]).tolist()),
            )
        )
    return records


# --- TSV tasks ------------------------------------------------------------------


HEADER_NAMES = {
    "sentence",
    "sentence1",
    "sentence2",
    "sentence_a",
    "sentence_b",
    "text",
    "text_a",
    "text_b",
    "premise",
    "hypothesis",
    "question",
    "label",
    "score",
}


def _numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def header_reason(first: list[str], others: list[str | None], text_columns: int, label_column: int | None) -> str:
    """Why the first row of a TSV file looks like a column header ("" when it does not).

    Conservative: the text cells are all one header-like name (``sentence``, ``text_a``, ...),
    or the label occurs nowhere else while every other label repeats (classes) or is a number.
    ``others`` are the labels of the other rows.
    """
    names = [first[i].strip().lower() for i in range(text_columns)]
    if all(n in HEADER_NAMES for n in names):
        return f"its text columns are named {names}"
    if label_column is None or len(others) < 2:
        return ""
    label = first[label_column].strip()
    if label in others:
        return ""
    if all(_numeric(o) for o in others) and not _numeric(label):
        return f"its label {label!r} is not a number while every other label is"
    counts: dict[str, int] = {}
    for o in others:
        counts[o] = counts.get(o, 0) + 1
    if min(counts.values()) > 1:
        return f"its label {label!r} occurs nowhere else while every other label ({sorted(counts)[:5]}) repeats"
    return ""


def tsv_records(
    path: str | Path,
    text_columns: int,
    label_column: int | None,
    limit: int = 0,
    prefix: str = "",
    header: bool | str = "auto",
) -> list[Record]:
    """Whitespace-tokenised sentences (one text column) or pairs (two) from a TSV file.

    ``header``: True skips the first non-empty line, False reads it as a record, "auto" raises
    CorpusError when it looks like a column header (:func:`header_reason`).
    """
    path = Path(path)
    need = text_columns + (0 if label_column is None else 1)
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        cols = line.rstrip("\n").split("\t")
        if len(cols) < need:
            raise CorpusError(f"{path}:{lineno}: expected at least {need} tab-separated columns, found {len(cols)}")
        rows.append((lineno, cols))
    if rows and header is True:
        rows = rows[1:]
    elif rows and header == "auto":
        others = [cols[label_column].strip() for _, cols in rows[1:]] if label_column is not None else []
        why = header_reason(rows[0][1], others, text_columns, label_column)
        if why:
            raise CorpusError(
                f"{path}:{rows[0][0]}: this line looks like a column header ({why}); remove it, or set the corpus "
                "option header: true to skip it (header: false reads it as a record)"
            )
    records = []
    for lineno, cols in rows[: limit or None]:
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
    return records


def build_corpus(spec: dict, name: str = "", skipped: list[str] | None = None) -> list[Record]:
    """Build the records of one corpus from its config entry.

    Sentences left out by ``invalid_trees: skip`` are appended to ``skipped`` (one message each).
    """
    kind = spec["kind"]
    paths = spec["paths"] if "paths" in spec else [spec["path"]]
    invalid = spec.get("invalid_trees", "error")
    records: list[Record] = []
    for p in paths:
        if kind == "conllu":
            records += sentence_records(read_conllu(p, invalid, skipped))
        elif kind == "conllu_documents":
            records += document_records(
                read_conllu(p, invalid, skipped), path=str(p), max_words=spec.get("max_words", 0)
            )
        elif kind == "wikitext":
            records += wiki_segments(p, spec["n_segments"], spec["max_words"], spec["seed"])
        elif kind == "wikitext_long":
            records += wiki_long_segments(p, spec["n_segments"], spec["tokens"], spec["seed"])
        elif kind == "records":
            records += load_records(p)
        elif kind == "tsv":
            records += tsv_records(
                p,
                spec["text_columns"],
                spec.get("label_column"),
                prefix=f"{name}-{Path(p).stem}",
                header=spec.get("header", "auto"),
            )
        else:
            raise CorpusError(f"corpus {name!r}: unknown kind {kind!r}")
    limit = spec.get("limit", 0)
    if limit and kind not in ("wikitext", "wikitext_long"):
        records = records[:limit]
    if not records:
        raise CorpusError(f"corpus {name!r}: no records in {', '.join(map(str, paths))}")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise CorpusError(f"corpus {name!r}: duplicate record ids")
    return records
