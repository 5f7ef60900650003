"""Corpus readers: CoNLL-U (sentences, documents, coreference), WikiText segments, TSV pairs."""

from __future__ import annotations

import re

import pytest
from conftest import EWT_DEV, SICK_TEST, WIKI_TEST

from headatlas.core.corpora import (
    CorpusError,
    build_corpus,
    document_records,
    parse_mentions,
    read_conllu,
    sentence_records,
    tsv_records,
    wiki_segments,
)
from headatlas.core.data import Record, load_records, read_records, write_records


def row(*cols) -> str:
    assert len(cols) == 10
    return "\t".join(str(c) for c in cols)


def tok(i, form, head, deprel="dep", misc="_", upos="X") -> str:
    return row(i, form, form.lower(), upos, upos, "_", head, deprel, "_", misc)


def write(tmp_path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- CoNLL-U sentences --------------------------------------------------------------


def test_multiword_tokens_and_empty_nodes_are_skipped(tmp_path):
    path = write(
        tmp_path,
        "mwt.conllu",
        [
            "# newdoc id = doc-a",
            "# sent_id = s1",
            "# text = I can't go home.",
            tok(1, "I", 4, "nsubj", upos="PRON"),
            row("2-3", "can't", "_", "_", "_", "_", "_", "_", "_", "_"),
            tok(2, "ca", 4, "aux", upos="AUX"),
            tok(3, "n't", 4, "advmod", upos="PART"),
            tok(4, "go", 0, "root", upos="VERB"),
            row("4.1", "went", "go", "VERB", "VBD", "_", "_", "_", "4:conj", "_"),
            tok(5, "home", 4, "obj", upos="NOUN"),
            tok(6, ".", 4, "punct", upos="PUNCT"),
            "",
            "# sent_id = s2",
            tok(1, "Yes", 0, "root"),
            tok(2, "!", 1, "punct"),
            "",
        ],
    )
    sents = read_conllu(path)
    assert [s.sent_id for s in sents] == ["s1", "s2"]
    assert sents[0].words == ["I", "ca", "n't", "go", "home", "."]
    assert sents[0].head == [4, 4, 4, 0, 4, 4]
    assert sents[0].doc == "doc-a" and sents[1].doc == "doc-a"
    recs = sentence_records(sents)
    assert recs[0].words == ("I", "ca", "n't", "go", "home", ".")
    assert recs[0].head == (3, 3, 3, -1, 3, 3)
    assert recs[0].deprel == ("nsubj", "aux", "advmod", "root", "obj", "punct")
    assert recs[0].upos[3] == "VERB"
    assert recs[1].head == (-1, 0)
    assert recs[0].segment == (0,) * 6 and not recs[0].is_pair


def test_last_sentence_without_trailing_blank_line(tmp_path):
    path = tmp_path / "noblank.conllu"
    path.write_text("# sent_id = only\n" + tok(1, "Hi", 0, "root") + "\n" + tok(2, "there", 1) + "\n", encoding="utf-8")
    (s,) = read_conllu(path)
    assert s.words == ["Hi", "there"] and s.head == [0, 1]


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("1\tHi\thi\tX\tX\t_\t0\troot\t_", "columns"),  # 9 columns
        (row(2, "there", "there", "X", "X", "_", "one", "dep", "_", "_"), "HEAD"),  # non-integer head
        (row(3, "there", "there", "X", "X", "_", 1, "dep", "_", "_"), "out of order"),  # skips ID 2
        (row("x", "there", "there", "X", "X", "_", 1, "dep", "_", "_"), "token ID"),
        (row("2-x", "there", "there", "X", "X", "_", 1, "dep", "_", "_"), "token ID"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, needle):
    lines = ["# sent_id = a", tok(1, "Fine", 0, "root"), "", "# sent_id = b", tok(1, "Hi", 0, "root"), bad, ""]
    path = write(tmp_path, "bad.conllu", lines)
    with pytest.raises(CorpusError) as err:
        read_conllu(path)
    msg = str(err.value)
    assert f"{path}:6" in msg  # the bad line is line 6
    assert needle in msg


def test_head_outside_sentence_names_file(tmp_path):
    path = write(tmp_path, "range.conllu", ["# sent_id = s", tok(1, "a", 0, "root"), tok(2, "b", 7), ""])
    with pytest.raises(CorpusError) as err:
        read_conllu(path)
    assert str(err.value) == f"{path}:3: sentence 's' is not a tree: word 2 has HEAD 7 outside 0..2"


# --- coreference ----------------------------------------------------------------------


def test_coref_brackets():
    ents = ["(1", "", "1)", "(2)", "(3(4)", "3)"]
    assert parse_mentions(ents) == [(0, 2, 1), (3, 3, 2), (4, 4, 4), (4, 5, 3)]


def test_coref_nested_same_cluster():
    # two open mentions of cluster 5 close innermost first
    assert parse_mentions(["(5", "(5", "5)", "5)"]) == [(0, 3, 5), (1, 2, 5)]


@pytest.mark.parametrize("ents", [["1)"], ["(1", ""], ["(1", "2)"]])
def test_coref_unbalanced_brackets_raise(ents):
    with pytest.raises(CorpusError):
        parse_mentions(ents, where="x.conllu")


def _doc_lines():
    return [
        "# newdoc id = d1",
        "# sent_id = d1-1",
        tok(1, "Kim", 2, "nsubj", "Entity=(1"),
        tok(2, "Lee", 3, "flat", "Entity=1)|SpaceAfter=No"),
        tok(3, "left", 0, "root"),
        "",
        "# sent_id = d1-2",
        tok(1, "She", 2, "nsubj", "Entity=(1)"),
        tok(2, "returned", 0, "root"),
        tok(3, "home", 2, "obj", "Entity=(2(3)"),
        tok(4, "today", 2, "obl", "Entity=2)"),
        "",
        "# newdoc id = d2",
        "# sent_id = d2-1",
        tok(1, "Rain", 2, "nsubj", "Entity=(7)"),
        tok(2, "fell", 0, "root"),
        "",
    ]


def test_document_records_group_by_newdoc(tmp_path):
    path = write(tmp_path, "docs.conllu", _doc_lines())
    recs = document_records(read_conllu(path), path=str(path))
    assert [r.id for r in recs] == ["d1", "d2"]
    d1, d2 = recs
    assert d1.words == ("Kim", "Lee", "left", "She", "returned", "home", "today")
    assert d1.sentence == (0, 0, 0, 1, 1, 1, 1)
    # heads are absolute within the document; each sentence root is -1
    assert d1.head == (1, 2, -1, 4, -1, 4, 4)
    assert d1.mentions == ((0, 1, 1), (3, 3, 1), (5, 5, 3), (5, 6, 2))
    assert d2.words == ("Rain", "fell") and d2.head == (1, -1) and d2.mentions == ((0, 0, 7),)
    assert d1.doc == "d1" and d2.doc == "d2"


def test_document_records_max_words_drops_crossing_mentions(tmp_path):
    path = write(tmp_path, "docs.conllu", _doc_lines())
    d1 = document_records(read_conllu(path), path=str(path), max_words=6)[0]
    assert len(d1.words) == 6
    # the (5, 6) mention crosses the cut; heads pointing past it become -1
    assert d1.mentions == ((0, 1, 1), (3, 3, 1), (5, 5, 3))
    assert d1.head == (1, 2, -1, 4, -1, 4)


def test_build_corpus_conllu_documents(tmp_path):
    path = write(tmp_path, "docs.conllu", _doc_lines())
    recs = build_corpus({"kind": "conllu_documents", "path": str(path)}, "gum")
    assert [len(r.words) for r in recs] == [7, 2]


# --- build_corpus ---------------------------------------------------------------------


def test_empty_corpus_raises(tmp_path):
    path = write(tmp_path, "empty.conllu", ["# just a comment", ""])
    with pytest.raises(CorpusError, match="no records"):
        build_corpus({"kind": "conllu", "path": str(path)}, "empty")


def test_empty_jsonl_corpus_raises(tmp_path):
    path = tmp_path / "empty.jsonl.gz"
    write_records([], path)
    with pytest.raises(ValueError, match="empty"):
        load_records(path)


def test_unknown_kind_raises(tmp_path):
    with pytest.raises(CorpusError, match="unknown kind"):
        build_corpus({"kind": "xml", "path": str(tmp_path / "x")}, "weird")


def test_duplicate_ids_raise(tmp_path):
    path = write(
        tmp_path,
        "dup.conllu",
        ["# sent_id = same", tok(1, "a", 0, "root"), "", "# sent_id = same", tok(1, "b", 0, "root"), ""],
    )
    with pytest.raises(CorpusError, match="duplicate"):
        build_corpus({"kind": "conllu", "path": str(path)}, "dup")


def test_ewt_dev_counts():
    recs = build_corpus({"kind": "conllu", "path": str(EWT_DEV)}, "ewt_dev")
    assert len(recs) == 2001
    assert sum(len(r.words) for r in recs) == 25147
    # every head points inside its sentence, exactly one root per sentence
    for r in recs:
        assert all(-1 <= h < len(r.words) for h in r.head)
        assert r.head.count(-1) == 1
    limited = build_corpus({"kind": "conllu", "path": str(EWT_DEV), "limit": 20}, "ewt_dev")
    assert limited == recs[:20]


def test_records_round_trip_jsonl_gz(tmp_path, ewt_records):
    path = tmp_path / "c.jsonl.gz"
    recs = list(ewt_records[:5]) + [
        Record(id="p", words=("a", "b", "c"), segment=(0, 1, 1), mentions=((0, 1, 3),), label="X")
    ]
    assert write_records(recs, path) == len(recs)
    assert list(read_records(path)) == recs


def test_bad_jsonl_record_names_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"id": "a", "words": ["x"], "segment": [0]}\n{"id": "b", "words": [], "segment": []}\n', encoding="utf-8"
    )
    with pytest.raises(ValueError, match=re.escape(f"{path}:2")):
        load_records(path)


# --- WikiText segments ------------------------------------------------------------------


def test_wiki_segments_deterministic_pairs():
    a = wiki_segments(WIKI_TEST, n_segments=12, max_words=40, seed=0)
    b = wiki_segments(WIKI_TEST, n_segments=12, max_words=40, seed=0)
    c = wiki_segments(WIKI_TEST, n_segments=12, max_words=40, seed=1)
    assert a == b
    assert [r.id for r in a] != [r.id for r in c]
    assert len(a) == 12 and len({r.id for r in a}) == 12
    for r in a:
        seg = list(r.segment)
        assert r.is_pair
        assert seg[0] == 0 and seg[-1] == 1
        assert seg == sorted(seg)  # all of segment 0, then all of segment 1
        assert seg.count(0) <= 20 and seg.count(1) <= 20
        assert len(r.words) <= 40
        assert not any(w in ("@-@", "@,@", "@.@") for w in r.words)
        assert r.sentence == r.segment


def test_wiki_segments_through_build_corpus_ignores_limit():
    spec = {"kind": "wikitext", "path": str(WIKI_TEST), "n_segments": 3, "max_words": 10, "seed": 4, "limit": 1}
    recs = build_corpus(spec, "wiki")
    assert recs == wiki_segments(WIKI_TEST, 3, 10, 4)


def test_wiki_joiners_are_undone(tmp_path):
    path = tmp_path / "w.raw"
    path.write_text(
        " = Title = \n a state @-@ of @-@ the @-@ art 1 @,@ 000 item \n = = Sub = = \n second para 3 @.@ 5 \n",
        encoding="utf-8",
    )
    (rec,) = wiki_segments(path, n_segments=5, max_words=100, seed=0)
    assert rec.words == ("a", "state-of-the-art", "1,000", "item", "second", "para", "3.5")
    assert rec.segment == (0, 0, 0, 0, 1, 1, 1)


# --- TSV ----------------------------------------------------------------------------------


def test_sick_pairs():
    recs = build_corpus(
        {"kind": "tsv", "path": str(SICK_TEST), "text_columns": 2, "label_column": 2, "limit": 25}, "sick"
    )
    assert len(recs) == 25
    with open(SICK_TEST, encoding="utf-8") as fh:
        first = fh.readline().rstrip("\n").split("\t")
    r = recs[0]
    assert r.is_pair
    assert r.segment_words() == [first[0].split(), first[1].split()]
    assert r.label == first[2].strip()
    for r in recs:
        assert r.label in {"NEUTRAL", "ENTAILMENT", "CONTRADICTION"}
        seg = list(r.segment)
        assert seg[0] == 0 and seg[-1] == 1 and seg == sorted(seg)


def test_tsv_single_sentences_and_errors(tmp_path):
    path = tmp_path / "s.tsv"
    path.write_text("a good film\t1\nbad\t0\n", encoding="utf-8")
    recs = tsv_records(path, text_columns=1, label_column=1)
    assert [r.words for r in recs] == [("a", "good", "film"), ("bad",)]
    assert [r.label for r in recs] == ["1", "0"] and not recs[0].is_pair
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\tL\nonly-one-column\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=re.escape(f"{bad}:2")):
        tsv_records(bad, text_columns=2, label_column=2)


def test_gzip_corpora_are_the_same_bytes_in_every_run(tmp_path):
    """A gzip corpus holds no file name or time in its header, so two runs write the same bytes (and the same
    checksum seal): a SLURM run and a local run of the same config agree file for file."""
    recs = [Record(id=f"s{i}", words=("a", "b", str(i)), segment=(0, 0, 0)) for i in range(5)]
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "other_name.jsonl.gz"
    write_records(recs, a)
    write_records(recs, b)
    assert a.read_bytes() == b.read_bytes()
    assert [r.id for r in read_records(b)] == [r.id for r in recs]
