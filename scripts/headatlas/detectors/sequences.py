"""The detectors' inputs: natural text from a corpus and seeded random token sequences, framed as the
model expects ([CLS] ... [SEP] for an encoder, a BOS for a decoder that takes one).

Input kinds (every sequence is ``length`` tokens long, framing included, except natural text, which is cut
to at most ``length`` tokens at a word boundary):

- ``natural``: the first ``n_sequences`` records of each natural corpus;
- ``random``: ``length - framing`` distinct ordinary tokens drawn uniformly (Gu et al.'s random tokens);
- ``repeated_token``: one ordinary token repeated ``length - framing`` times (Gu et al.'s repeated tokens;
  here framed, so the first position is [CLS] / BOS, unlike their unframed input);
- ``repeated``: ``repeat_length`` = m distinct ordinary tokens followed by the same m tokens (Olsson et al.'s
  repeated random tokens: every token occurs exactly twice, so its first occurrence is unambiguous).

Ordinary tokens: every id of the tokenizer except special and added tokens, ``[unusedN]`` / ``<unusedN>``
placeholders, byte-fallback pieces ``<0xNN>``, and pieces that decode to nothing printable or to a partial
UTF-8 character (byte-level BPE pieces of a multi-byte character).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from ..core.align import encode_record
from ..core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record, TokenizedRecord
from ..core.settings import Settings

INPUT_KINDS = ("natural", "random", "repeated_token", "repeated")
_PLACEHOLDER = re.compile(r"^(\[unused\d+\]|<unused\d+>|<0x[0-9A-Fa-f]{2}>)$")


class DetectorInputError(ValueError):
    """Inputs that cannot score a detector; the message names the lengths."""


@dataclass(frozen=True, kw_only=True)
class DetectorSettings(Settings):
    """analysis.detectors (workflow/schemas/detectors.schema.yaml)."""

    SECTION = "analysis.detectors"

    n_sequences: int = 64
    length: int = 64
    repeat_length: int = 31
    sink_epsilon: float = 0.3
    seed: int = 0
    bootstrap: int = 1000
    ci: float = 0.95
    alpha: float = 0.05
    fdr_method: str = "fdr_bh"
    batch_size: int = 16


@dataclass(frozen=True, kw_only=True)
class LongDetectorSettings(Settings):
    """analysis.detectors.long: the detectors on a long corpus (its ``corpora`` go to the workflow, which runs one
    job per model and long corpus); the rest of the section's settings are the detectors'."""

    SECTION = "analysis.detectors.long"

    n_sequences: int = 4
    batch_size: int = 1


def long_settings(
    settings: DetectorSettings, long: LongDetectorSettings, length: int, framing: int
) -> DetectorSettings:
    """The detectors' settings on a long corpus of ``length`` tokens per input: every input kind ``length`` tokens
    (framing included), the repeated block m = (length - framing) // 2, ``long``'s sequences and batch size."""
    return replace(
        settings,
        length=int(length),
        repeat_length=max(0, (int(length) - framing) // 2),
        n_sequences=long.n_sequences,
        batch_size=long.batch_size,
    )


def ordinary_ids(tokenizer) -> np.ndarray:
    """Sorted ids of the tokenizer's ordinary tokens (see the module docstring)."""
    n = len(tokenizer)
    ids = np.arange(n)
    bad = np.zeros(n, dtype=bool)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    bad[[i for i in special if 0 <= i < n]] = True
    pieces = tokenizer.convert_ids_to_tokens(ids.tolist())
    texts = tokenizer.batch_decode([[int(i)] for i in ids])
    for i, (piece, text) in enumerate(zip(pieces, texts)):
        if piece is None or _PLACEHOLDER.match(piece) or "\ufffd" in text or not text.strip():
            bad[i] = True
    return ids[~bad]


def frame(ids, tokenizer, kind: str, bos: int | None, record_index: int) -> TokenizedRecord:
    """A TokenizedRecord of content ``ids`` framed as the model reads one segment: [CLS] ids [SEP]
    (encoder) or BOS ids (decoder with a BOS id) or ids alone."""
    ids = [int(i) for i in ids]
    if kind == "encoder":
        full = [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]
        special = [SPECIAL_CLS, *[SPECIAL_NONE] * len(ids), SPECIAL_SEP]
    elif bos is not None:
        full, special = [bos, *ids], [SPECIAL_BOS, *[SPECIAL_NONE] * len(ids)]
    else:
        full, special = ids, [SPECIAL_NONE] * len(ids)
    word = np.where(np.asarray(special) == SPECIAL_NONE, np.cumsum(np.asarray(special) == SPECIAL_NONE) - 1, -1)
    return TokenizedRecord(
        record_index=record_index,
        ids=tuple(full),
        pieces=tuple(tokenizer.convert_ids_to_tokens(full)),
        word=tuple(word.tolist()),
        special=tuple(special),
        segment=(0,) * len(full),
        n_words=len(ids),
    )


def n_framing(kind: str, bos: int | None) -> int:
    """Special tokens :func:`frame` adds."""
    return 2 if kind == "encoder" else (1 if bos is not None else 0)


def check_lengths(settings: DetectorSettings, kind: str, bos: int | None, max_length: int, model: str = "") -> None:
    """Raise DetectorInputError when the random inputs cannot be built or scored, naming the lengths."""
    s, f = settings, n_framing(kind, bos)
    keys = f"(config keys analysis.detectors.repeat_length / length, models[{model}].max_length)"
    if s.repeat_length < 2:
        raise DetectorInputError(
            f"model {model!r}: repeat_length m = {s.repeat_length}: the induction detector needs m >= 2 "
            f"(a token t_i and the token t_{{i+1}} after it) {keys}"
        )
    if 2 * s.repeat_length + f > max_length:
        raise DetectorInputError(
            f"model {model!r}: the repeated sequence is 2 x {s.repeat_length} tokens + {f} special = "
            f"{2 * s.repeat_length + f} tokens, more than max_length {max_length} {keys}"
        )
    if s.length - f < 2:
        raise DetectorInputError(
            f"model {model!r}: length {s.length} leaves {s.length - f} content tokens after {f} special; need >= 2 {keys}"
        )
    if s.length > max_length:
        raise DetectorInputError(f"model {model!r}: length {s.length} is more than max_length {max_length} {keys}")


def random_inputs(
    tokenizer,
    kind: str,
    bos: int | None,
    settings: DetectorSettings,
    max_length: int,
    first_index: int = 0,
    model: str = "",
) -> tuple[list[TokenizedRecord], list[str]]:
    """The seeded ``random``, ``repeated_token`` and ``repeated`` sequences (n_sequences each), and the
    input kind of each. The draws depend only on the seed, the vocabulary and the settings."""
    s = settings
    check_lengths(s, kind, bos, max_length, model)
    vocab = ordinary_ids(tokenizer)
    content = s.length - n_framing(kind, bos)
    if max(content, s.repeat_length) > len(vocab):
        raise DetectorInputError(f"model {model!r}: {len(vocab)} ordinary tokens, fewer than a sequence needs")
    rng = np.random.default_rng([s.seed, len(vocab)])
    out, kinds = [], []
    for name in ("random", "repeated_token", "repeated"):
        for _ in range(s.n_sequences):
            if name == "random":
                ids = rng.choice(vocab, size=content, replace=False)
            elif name == "repeated_token":
                ids = np.full(content, rng.choice(vocab))
            else:
                half = rng.choice(vocab, size=s.repeat_length, replace=False)
                ids = np.concatenate([half, half])
            out.append(frame(ids, tokenizer, kind, bos, first_index + len(out)))
            kinds.append(name)
    return out, kinds


def natural_inputs(
    records: list[Record], tokenizer, kind: str, bos: int | None, settings: DetectorSettings, first_index: int = 0
) -> tuple[list[TokenizedRecord], list[str]]:
    """The first ``n_sequences`` records that tokenise to at least 2 tokens, cut to ``length`` tokens at a word
    boundary, and their record ids."""
    out, ids = [], []
    for r in records:
        if len(out) == settings.n_sequences:
            break
        t = encode_record(r, tokenizer, kind, settings.length, "truncate", bos, record_index=first_index + len(out))
        if t is not None and len(t) >= 2:
            out.append(t)
            ids.append(r.id)
    return out, ids


def inputs_table(tokenized: list[TokenizedRecord], kinds: list[str], sources: list[str]):
    """The token ids used, one row per sequence (the rule's inputs.tsv)."""
    import pandas as pd

    return pd.DataFrame(
        {
            "sequence": np.arange(len(tokenized)),
            "input": kinds,
            "source": sources,
            "length": [len(t) for t in tokenized],
            "ids": [" ".join(map(str, t.ids)) for t in tokenized],
        }
    )
