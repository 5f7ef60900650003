"""Tokenisation with word alignment from tokenizer offsets (WordPiece and byte-level BPE).

Rule for pieces that cover no word character (byte-level BPE emits a lone space piece
``Ġ`` before some digits, for example): such a piece belongs to the **next** word in the
text, or to the last word when none follows. The same rule holds in every analysis
because every analysis reads the stored word index.
"""

from __future__ import annotations

import numpy as np

from .data import (
    SPECIAL_BOS,
    SPECIAL_CLS,
    SPECIAL_EOS,
    SPECIAL_NONE,
    SPECIAL_OTHER,
    SPECIAL_SEP,
    Record,
    TokenizedRecord,
)


class AlignmentError(ValueError):
    pass


def char_to_word(words: list[str]) -> tuple[str, np.ndarray, np.ndarray]:
    """Join words with single spaces; return the text, the word index of each
    character (-1 between words) and the sorted positions of word (non-space) characters."""
    text = " ".join(words)
    char_word = np.full(len(text), -1, dtype=np.int64)
    pos = 0
    for i, w in enumerate(words):
        char_word[pos : pos + len(w)] = i
        pos += len(w) + 1
    is_space = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == ord(" ")
    wordchars = np.flatnonzero((char_word >= 0) & ~is_space)
    return text, char_word, wordchars


def offsets_to_words(offsets: np.ndarray, char_word: np.ndarray, wordchars: np.ndarray, n_words: int) -> np.ndarray:
    """Word index of each piece: the word of the first word character at or after the
    piece's start offset (so a space-only piece joins the following word)."""
    starts = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    j = np.searchsorted(wordchars, starts)
    out = np.full(len(starts), n_words - 1, dtype=np.int64)
    ok = j < len(wordchars)
    out[ok] = char_word[wordchars[j[ok]]]
    return out


def _special_kind(tok_id: int, tokenizer) -> int:
    for attr, kind in (
        ("cls_token_id", SPECIAL_CLS),
        ("sep_token_id", SPECIAL_SEP),
        ("bos_token_id", SPECIAL_BOS),
        ("eos_token_id", SPECIAL_EOS),
    ):
        if getattr(tokenizer, attr, None) is not None and tok_id == getattr(tokenizer, attr):
            return kind
    return SPECIAL_OTHER


def bos_id(tokenizer, bos_token: str) -> int | None:
    """The id to prepend to decoder inputs: 'auto' uses the tokenizer's BOS, 'none' nothing."""
    if bos_token == "none":
        return None
    if bos_token == "auto":
        return tokenizer.bos_token_id
    tid = tokenizer.convert_tokens_to_ids(bos_token)
    if tid is None or tokenizer.convert_ids_to_tokens(tid) != bos_token:
        raise AlignmentError(f"bos_token {bos_token!r} is not in the tokenizer's vocabulary")
    return tid


def _encode_words(words: list[str], segment: list[int], tokenizer, kind: str, bos: int | None):
    """Encode the words as the model reads them; return per-token arrays."""
    seg = np.asarray(segment)
    pair = bool(seg.any())
    if kind == "encoder":
        split = int(np.argmax(seg)) if pair else len(words)
        parts = [words[:split], words[split:]] if pair else [words]
        maps = [char_to_word(p) for p in parts]
        enc = tokenizer(
            maps[0][0],
            maps[1][0] if pair else None,
            add_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_token_type_ids=True,
        )
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        special = np.asarray(enc["special_tokens_mask"], dtype=bool)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        seq_ids = np.array([-1 if s is None else s for s in enc.sequence_ids()])
        word = np.full(len(ids), -1, dtype=np.int64)
        base = 0
        for k, (_text, char_word, wordchars) in enumerate(maps):
            sel = (seq_ids == k) & ~special
            word[sel] = offsets_to_words(offsets[sel], char_word, wordchars, len(parts[k])) + base
            base += len(parts[k])
        tt = enc.get("token_type_ids")
        token_seg = np.asarray(tt, dtype=np.int64) if tt is not None and pair else np.zeros(len(ids), dtype=np.int64)
        if pair and tt is None:
            token_seg = np.maximum.accumulate(np.where(seq_ids == 1, 1, 0))
    else:
        text, char_word, wordchars = char_to_word(words)
        enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        special = np.asarray(enc["special_tokens_mask"], dtype=bool)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        if bos is not None and not (len(ids) and ids[0] == bos and special[0]):
            ids = np.concatenate([[bos], ids])
            special = np.concatenate([[True], special])
            offsets = np.concatenate([[[0, 0]], offsets])
        word = np.full(len(ids), -1, dtype=np.int64)
        word[~special] = offsets_to_words(offsets[~special], char_word, wordchars, len(words))
        token_seg = np.zeros(len(ids), dtype=np.int64)
        token_seg[~special] = seg[word[~special]]
        # special tokens take the segment of the token before them (BOS: segment 0)
        idx = np.where(~special, np.arange(len(ids)), 0)
        token_seg = np.where(special, token_seg[np.maximum.accumulate(idx)], token_seg)
    kinds = np.zeros(len(ids), dtype=np.int64)
    for i in np.flatnonzero(special):
        kinds[i] = _special_kind(int(ids[i]), tokenizer)
    if kind == "decoder" and bos is not None and len(ids) and special[0]:
        kinds[0] = SPECIAL_BOS
    return ids, word, kinds, token_seg


def encode_record(
    record: Record,
    tokenizer,
    kind: str,
    max_length: int,
    overflow: str = "skip",
    bos: int | None = None,
    record_index: int = 0,
) -> TokenizedRecord | None:
    """Tokenise one record. Returns None when it is longer than ``max_length`` and
    ``overflow`` is 'skip'; with 'truncate' the longest word prefix that fits is kept."""
    if overflow not in ("skip", "truncate"):
        raise ValueError(f"overflow must be 'skip' or 'truncate', not {overflow!r}")
    words, segment = list(record.words), list(record.segment or (0,) * len(record.words))
    ids, word, kinds, seg = _encode_words(words, segment, tokenizer, kind, bos)
    truncated = False
    if len(ids) > max_length:
        if overflow == "skip":
            return None
        lo, hi = 0, len(words)  # invariant: lo words fit, hi words do not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if len(_encode_words(words[:mid], segment[:mid], tokenizer, kind, bos)[0]) <= max_length:
                lo = mid
            else:
                hi = mid
        if lo == 0:
            return None
        words, segment = words[:lo], segment[:lo]
        ids, word, kinds, seg = _encode_words(words, segment, tokenizer, kind, bos)
        truncated = True
    pieces = tokenizer.convert_ids_to_tokens(ids.tolist())
    return TokenizedRecord(
        record_index=record_index,
        ids=tuple(ids.tolist()),
        pieces=tuple(pieces),
        word=tuple(word.tolist()),
        special=tuple(kinds.tolist()),
        segment=tuple(seg.tolist()),
        n_words=len(words),
        truncated=truncated,
    )


__all__ = ["encode_record", "char_to_word", "offsets_to_words", "bos_id", "AlignmentError", "SPECIAL_NONE"]
