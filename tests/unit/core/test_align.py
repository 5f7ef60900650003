"""Token-to-word alignment for WordPiece (encoders) and byte-level BPE (decoders)."""

from __future__ import annotations

import numpy as np
import pytest

from headatlas.core.align import AlignmentError, bos_id, char_to_word, encode_record, offsets_to_words
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record


def rec(words, segment=None, id="r"):
    words = tuple(words)
    return Record(id=id, words=words, segment=tuple(segment) if segment else (0,) * len(words))


def pieces_of(t, w):
    return [p for p, i in zip(t.pieces, t.word) if i == w]


# --- hand-made offsets ------------------------------------------------------------------


def test_char_to_word():
    text, char_word, wordchars = char_to_word(["ab", "c", "def"])
    assert text == "ab c def"
    assert char_word.tolist() == [0, 0, -1, 1, -1, 2, 2, 2]
    assert wordchars.tolist() == [0, 1, 3, 5, 6, 7]


def test_offsets_to_words_hand_made():
    _, char_word, wordchars = char_to_word(["ab", "cd", "e"])  # "ab cd e"
    offsets = np.array(
        [
            [0, 1],  # "a"
            [1, 2],  # "b"
            [2, 3],  # " " alone: joins the following word
            [3, 5],  # "cd"
            [5, 7],  # " e": starts on the space, belongs to "e"
            [4, 5],  # "d"
            [7, 7],  # empty piece at the very end: last word
        ]
    )
    assert offsets_to_words(offsets, char_word, wordchars, 3).tolist() == [0, 0, 1, 1, 2, 1, 2]


def test_offsets_to_words_space_only_piece_before_each_word():
    words = ["x", "y", "z"]
    _, char_word, wordchars = char_to_word(words)  # "x y z"
    offsets = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]])  # x, " ", y, " ", z
    assert offsets_to_words(offsets, char_word, wordchars, 3).tolist() == [0, 1, 1, 2, 2]


# --- WordPiece (BERT) ---------------------------------------------------------------------


def test_wordpiece_split_words_share_word_index(bert_tokenizer):
    words = ["President", "Bush", "nominated", "two", "individuals", "."]
    t = encode_record(rec(words), bert_tokenizer, "encoder", 64)
    assert t is not None and not t.truncated and t.n_words == len(words)
    n = len(t)
    assert len(t.pieces) == len(t.word) == len(t.special) == len(t.segment) == n
    # [CLS] ... [SEP]
    assert t.pieces[0] == "[CLS]" and t.word[0] == -1 and t.special[0] == SPECIAL_CLS
    assert t.pieces[-1] == "[SEP]" and t.word[-1] == -1 and t.special[-1] == SPECIAL_SEP
    inner = list(t.word[1:-1])
    assert all(k == SPECIAL_NONE for k in t.special[1:-1])
    assert inner == sorted(inner) and set(inner) == set(range(len(words)))
    split = [w for w in range(len(words)) if len(pieces_of(t, w)) > 1]
    assert {0, 2, 4} <= set(split), t.pieces  # president, nominated, individuals are split
    for w, word in enumerate(words):
        ps = pieces_of(t, w)
        assert all(p.startswith("##") for p in ps[1:])
        assert "".join(p.removeprefix("##") for p in ps) == word.lower()
    assert set(t.segment) == {0}
    assert t.ids == tuple(bert_tokenizer(" ".join(words))["input_ids"])


def test_wordpiece_word_split_by_pretokenizer(bert_tokenizer):
    # the basic pre-tokenizer splits "15-year" into three pieces; they stay one word
    t = encode_record(rec(["a", "15-year", "term"]), bert_tokenizer, "encoder", 64)
    assert pieces_of(t, 1) == ["15", "-", "year"]
    assert pieces_of(t, 2) == ["term"]


def test_wordpiece_pair_segments(bert_tokenizer):
    a, b = ["President", "Bush", "left"], ["nominated", "two"]
    t = encode_record(rec(a + b, [0] * 3 + [1] * 2), bert_tokenizer, "encoder", 64)
    enc = bert_tokenizer(" ".join(a), " ".join(b), return_token_type_ids=True)
    assert t.ids == tuple(enc["input_ids"])
    # BERT convention: [CLS] A [SEP] -> 0, B [SEP] -> 1
    assert t.segment == tuple(enc["token_type_ids"])
    sep = [i for i, k in enumerate(t.special) if k == SPECIAL_SEP]
    assert len(sep) == 2 and t.special[0] == SPECIAL_CLS
    first_sep = sep[0]
    assert set(t.segment[: first_sep + 1]) == {0} and set(t.segment[first_sep + 1 :]) == {1}
    assert [w for w in t.word[1:first_sep]] == sorted(w for w in t.word[1:first_sep])
    assert set(t.word[1:first_sep]) == {0, 1, 2}
    assert set(t.word[first_sep + 1 : -1]) == {3, 4}  # B words are numbered after A's
    assert pieces_of(t, 3) == ["nomi", "##nated"]


# --- byte-level BPE (GPT-2 / Llama) ----------------------------------------------------------


def test_bpe_bos_prepended(bpe_tokenizer):
    bos = bos_id(bpe_tokenizer, "auto")
    assert bos is not None and bos == bpe_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    words = ["The", "album", "was", "released", "in", "2008", "."]
    t = encode_record(rec(words), bpe_tokenizer, "decoder", 64, bos=bos)
    assert t.ids[0] == bos and t.special[0] == SPECIAL_BOS and t.word[0] == -1 and t.segment[0] == 0
    assert all(k == SPECIAL_NONE for k in t.special[1:])
    assert t.ids[1:] == tuple(bpe_tokenizer(" ".join(words))["input_ids"])
    assert list(t.word[1:]) == sorted(t.word[1:]) and set(t.word[1:]) == set(range(len(words)))
    for w, word in enumerate(words):
        assert bpe_tokenizer.convert_tokens_to_string(pieces_of(t, w)).strip() == word


def test_bpe_bos_none_and_explicit(bpe_tokenizer):
    words = ["a", "b"]
    t = encode_record(rec(words), bpe_tokenizer, "decoder", 64, bos=bos_id(bpe_tokenizer, "none"))
    assert SPECIAL_BOS not in t.special and -1 not in t.word
    explicit = bos_id(bpe_tokenizer, "<|endoftext|>")
    assert explicit == bpe_tokenizer.bos_token_id
    with pytest.raises(AlignmentError):
        bos_id(bpe_tokenizer, "<|no-such-token|>")


def test_bpe_space_only_piece_joins_following_word(bpe_tokenizer):
    # "x" and the Hangul syllable have no merge with the space in the tiny vocabulary,
    # so the tokenizer emits a lone "Ġ" piece before them.
    words = ["The", "x", "band", "\ud55c", "end"]
    t = encode_record(rec(words), bpe_tokenizer, "decoder", 64, bos=bos_id(bpe_tokenizer, "auto"))
    lone = [i for i, p in enumerate(t.pieces) if p == "Ġ"]
    assert len(lone) >= 2, t.pieces
    for i in lone:
        assert t.word[i] == t.word[i + 1], (t.pieces, t.word)
    assert t.word[lone[0]] == 1 and t.word[lone[1]] == 3
    assert set(t.word[1:]) == set(range(len(words)))


def test_bpe_pair_segments(bpe_tokenizer):
    words, seg = ["one", "two", "three", "four"], [0, 0, 1, 1]
    t = encode_record(rec(words, seg), bpe_tokenizer, "decoder", 64, bos=bos_id(bpe_tokenizer, "auto"))
    for w, s in zip(t.word, t.segment):
        assert s == (0 if w < 2 else 1)


# --- overflow ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_overflow_skip_and_truncate(model, bert_tokenizer, bpe_tokenizer, ewt_records):
    tok, kind = (bert_tokenizer, "encoder") if model == "bert" else (bpe_tokenizer, "decoder")
    bos = bos_id(tok, "auto") if kind == "decoder" else None
    words = [w for r in ewt_records[:6] for w in r.words]
    long = rec(words)
    full = encode_record(long, tok, kind, 10_000, bos=bos)
    assert len(full) > 16
    assert encode_record(long, tok, kind, 16, "skip", bos) is None
    t = encode_record(long, tok, kind, 16, "truncate", bos)
    assert t.truncated and len(t) <= 16
    assert 0 < t.n_words < len(words)
    assert max(t.word) == t.n_words - 1
    # the longest word prefix that fits: one more word would not fit
    assert len(encode_record(rec(words[: t.n_words + 1]), tok, kind, 10_000, bos=bos)) > 16
    prefix = encode_record(rec(words[: t.n_words]), tok, kind, 10_000, bos=bos)
    assert prefix.ids == t.ids and prefix.word == t.word
    if kind == "encoder":
        assert t.special[0] == SPECIAL_CLS and t.special[-1] == SPECIAL_SEP
    else:
        assert t.special[0] == SPECIAL_BOS
    # a record that fits is not touched by truncation
    short = encode_record(rec(words[:3]), tok, kind, 16, "truncate", bos)
    assert not short.truncated and short.n_words == 3


def test_overflow_bad_mode(bert_tokenizer):
    with pytest.raises(ValueError, match="overflow"):
        encode_record(rec(["a"]), bert_tokenizer, "encoder", 16, overflow="wrap")
