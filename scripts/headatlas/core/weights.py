"""GGUF files shipped as byte chunks in installed packages (model source ``gguf_parts``).

Each part is a module ``{prefix}{i}`` (i = 1 .. count) whose ``get_part_path()`` returns its data file; the files
joined in numeric order are one GGUF file. :func:`join_gguf_parts` checks every part against the size and SHA-256
its installed distribution's RECORD lists (so a corrupted part is named), and the joined file against the
``bytes`` and ``sha256`` of the config, before anything reads it as a GGUF file.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path

CHUNK = 16 * 2**20


class PartError(RuntimeError):
    """A part that is missing, corrupted or does not join into the expected file; the message names the package(s)."""


def part_modules(parts: dict) -> list[str]:
    """The part modules of a ``gguf_parts`` entry, in joining order: ``{prefix}1`` .. ``{prefix}{count}``."""
    return [f"{parts['prefix']}{i}" for i in range(1, int(parts["count"]) + 1)]


def missing_parts(parts: dict) -> list[str]:
    """The part modules that are not installed."""
    return [m for m in part_modules(parts) if importlib.util.find_spec(m) is None]


def _record(module: str, path: Path):
    """(size, urlsafe-base64 sha256) the installed distribution of ``module`` lists for ``path``; None when the
    module has no distribution metadata or its RECORD does not list the file with a hash."""
    try:
        dist = importlib.metadata.distribution(module)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.hash is not None and f.hash.mode == "sha256" and Path(dist.locate_file(f)).resolve() == path.resolve():
            return f.size, f.hash.value
    return None


def part_files(parts: dict) -> list[tuple[str, Path]]:
    """(module, data file) of every part, in joining order; PartError naming the missing packages or files."""
    missing = missing_parts(parts)
    if missing:
        raise PartError(f"package{'s' if len(missing) > 1 else ''} {', '.join(missing)} not installed")
    out = []
    for m in part_modules(parts):
        path = Path(importlib.import_module(m).get_part_path())
        if not path.is_file():
            raise PartError(f"package {m}: its data file {path} does not exist (a broken install)")
        out.append((m, path))
    return out


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def join_gguf_parts(parts: dict, out_path: str | Path) -> Path:
    """Join the parts into ``out_path`` (atomic) and return it. Before any byte is copied: every part's size against
    its RECORD and the total against ``parts['bytes']``; while copying, every part's SHA-256 against its RECORD and
    the joined file's against ``parts['sha256']``. Any difference is a PartError naming the package(s); no file is
    left behind."""
    files = part_files(parts)
    records = {m: _record(m, p) for m, p in files}
    sizes = {m: p.stat().st_size for m, p in files}
    bad = [m for m, _ in files if records[m] and records[m][0] is not None and records[m][0] != sizes[m]]
    if bad:
        raise PartError(
            f"package{'s' if len(bad) > 1 else ''} {', '.join(bad)} corrupted: data file size differs from the "
            "size its install record lists"
        )
    total = sum(sizes.values())
    if total != int(parts["bytes"]):
        raise PartError(
            f"packages {files[0][0]} .. {files[-1][0]} join into {total} bytes, not the {int(parts['bytes'])} of "
            "gguf_parts.bytes (a corrupted or wrong part)"
        )
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
    joined = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for m, path in files:
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    while block := fh.read(CHUNK):
                        h.update(block)
                        joined.update(block)
                        out.write(block)
                if records[m] and _b64(h.digest()) != records[m][1]:
                    raise PartError(f"package {m} corrupted: {path} differs from the SHA-256 its install record lists")
        if joined.hexdigest() != parts["sha256"].lower():
            unchecked = [m for m, _ in files if not records[m]]
            raise PartError(
                f"the joined file has SHA-256 {joined.hexdigest()}, not the {parts['sha256']} of gguf_parts.sha256; "
                + (
                    f"packages {', '.join(unchecked)} have no install record to check, one of them may be corrupted"
                    if unchecked
                    else f"every one of packages {files[0][0]} .. {files[-1][0]} matches its install record: "
                    "wrong versions installed, or a wrong gguf_parts.sha256"
                )
            )
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path
