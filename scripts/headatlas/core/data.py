"""The data model shared by every stage: a corpus record and a tokenized sequence.

A *record* is what a model reads as one input: one sentence, a sentence pair, or a
(truncated) document. Word-level annotations are tuples aligned with ``words``.
Dependency heads are absolute 0-based word indices within the record, -1 for ROOT.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable, Iterator

# Special-token kinds, as stored in the token table (int8).
SPECIAL_NONE, SPECIAL_CLS, SPECIAL_SEP, SPECIAL_BOS, SPECIAL_EOS, SPECIAL_OTHER = 0, 1, 2, 3, 4, 5
SPECIAL_NAMES = {
    SPECIAL_NONE: "",
    SPECIAL_CLS: "cls",
    SPECIAL_SEP: "sep",
    SPECIAL_BOS: "bos",
    SPECIAL_EOS: "eos",
    SPECIAL_OTHER: "other",
}


@dataclass(frozen=True)
class Record:
    """One model input with its words and gold annotations."""

    id: str
    words: tuple[str, ...]
    segment: tuple[int, ...]  # 0 = segment A, 1 = segment B, per word
    sentence: tuple[int, ...] = ()  # sentence index within the record, per word
    head: tuple[int, ...] = ()  # 0-based head word index, -1 = ROOT
    deprel: tuple[str, ...] = ()
    upos: tuple[str, ...] = ()
    xpos: tuple[str, ...] = ()
    lemma: tuple[str, ...] = ()
    feats: tuple[str, ...] = ()
    mentions: tuple[tuple[int, int, int], ...] = ()  # (first word, last word, cluster id)
    label: str = ""  # task label for classification corpora
    doc: str = ""
    split: str = ""  # train / dev / test for generated task corpora

    def __post_init__(self):
        n = len(self.words)
        if n == 0:
            raise ValueError(f"record {self.id!r} has no words")
        for f in ("segment", "sentence", "head", "deprel", "upos", "xpos", "lemma", "feats"):
            value = getattr(self, f)
            if value and len(value) != n:
                raise ValueError(f"record {self.id!r}: {f} has {len(value)} entries for {n} words")

    @property
    def is_pair(self) -> bool:
        return any(self.segment)

    def segment_words(self) -> list[list[str]]:
        """Words split by segment, in order (one list, or two for a pair)."""
        if not self.is_pair:
            return [list(self.words)]
        split = self.segment.index(1)
        return [list(self.words[:split]), list(self.words[split:])]

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if v not in ((), "")}
        return json.dumps(d, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        kwargs = {}
        names = {f.name for f in fields(cls)}
        for k, v in d.items():
            if k not in names:
                raise ValueError(f"unknown record field {k!r}")
            if k == "mentions":
                v = tuple(tuple(m) for m in v)
            elif isinstance(v, list):
                v = tuple(v)
            kwargs[k] = v
        return cls(**kwargs)


@dataclass(frozen=True)
class TokenizedRecord:
    """A record after tokenisation for one model."""

    record_index: int  # index of the record in its corpus file
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    word: tuple[int, ...]  # word index per token, -1 for special tokens
    special: tuple[int, ...]  # SPECIAL_* kind per token
    segment: tuple[int, ...]  # 0/1 per token
    n_words: int  # words kept (fewer than the record's when truncated)
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.ids)


class CorpusError(ValueError):
    """Malformed input; the message names the file and line."""


def _open(path: Path, mode: str):
    path = Path(path)
    if path.suffix != ".gz":
        return open(path, mode, encoding="utf-8")
    if mode == "r":
        return gzip.open(path, "rt", encoding="utf-8")
    # written with no name and mtime 0 in its header: the same records give the same bytes (and checksum) in
    # every run, whatever the temporary file was called
    raw = gzip.GzipFile(filename="", mode="wb", fileobj=open(path, "wb"), mtime=0)
    raw.myfileobj = raw.fileobj  # closed with the GzipFile
    return io.TextIOWrapper(raw, encoding="utf-8")


def _bad_utf8(path: Path) -> str:
    """``file:line: not UTF-8 (byte 0x.. at column ..)`` for the first undecodable byte of a file."""
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):  # no UTF-8 sequence spans a newline byte
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
    return f"{path}: not UTF-8"


def read_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (``.gz`` read transparently), as text-mode ``open`` yields them;
    an undecodable byte raises CorpusError naming the file, line and column, a truncated or corrupt gzip stream
    one naming the file."""
    path = Path(path)
    n = 0
    try:
        with _open(path, "r") as fh:
            for n, line in enumerate(fh, 1):  # noqa: B007 (n: where a broken gzip stream ends)
                yield line
    except UnicodeDecodeError:
        raise CorpusError(_bad_utf8(path)) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise CorpusError(
            f"{path}: truncated or corrupt gzip file after line {n} ({type(e).__name__}: {e}); "
            "rebuild or copy it again (a results/ file: delete it and rerun snakemake)"
        ) from None


def write_records(records: Iterable[Record], path: str | Path) -> int:
    n = 0
    with _open(Path(path), "w") as fh:
        for r in records:
            fh.write(r.to_json() + "\n")
            n += 1
    return n


def read_records(path: str | Path) -> Iterator[Record]:
    """Yield records from a JSON-lines corpus; errors name the file and line."""
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            yield Record.from_dict(json.loads(line))
        except (ValueError, TypeError) as e:
            raise CorpusError(f"{path}:{lineno}: bad corpus record: {e}") from e


def load_records(path: str | Path) -> list[Record]:
    records = list(read_records(path))
    if not records:
        raise CorpusError(f"{path}: corpus is empty")
    return records


@dataclass
class Counts:
    """Counters reported in logs (skipped or truncated sequences, for example)."""

    values: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, n: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + n

    def __getitem__(self, key: str) -> int:
        return self.values.get(key, 0)
