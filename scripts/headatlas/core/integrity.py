"""The integrity contract of every file one rule hands to another (docs/integrity.md).

- A file written through :func:`headatlas.core.io.atomic_path` is *sealed*: its sha256 is written beside it as
  ``<file>.sha256`` (the format of ``sha256sum``, so ``sha256sum -c`` checks it too). Figures and pages (read by
  no rule) are not sealed. A directory written whole (a model cache) is sealed by ``checksums.json`` inside it
  (every file's size and sha256, the schema of a store's manifest). Attention stores keep their own
  ``manifest.json`` (:mod:`headatlas.core.store`), which also covers the fused results in ``reduced/``.
- A rule checks every input when it starts (:func:`check_inputs`, from ``core.runner.setup``): a sealed file's
  checksum always (they are small), a sealed directory's sizes and the checksums of its files under
  :data:`HASH_BYTES` (the rest by ``headatlas store verify``). Readers add value checks where the values have
  a known range (:func:`check_values`, :func:`read_table`).
- At planning time the workflow asks :func:`damaged` for every sealed output under ``results/`` that no longer
  matches its seal and reruns its job (``workflow/rules/common.smk``); ``headatlas store verify results``
  checks the whole run directory (:func:`headatlas.core.store.run_faults`).

Every failure is an :class:`IntegrityError` that names the file, says what is wrong and how to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

CHECKSUM = "sha256"
SIDECAR = ".sha256"
DIR_SEAL = "checksums.json"
MANIFEST = "manifest.json"  # an attention store's seal (headatlas.core.store)
NESTED = ("reduced", "sample")  # subdirectories of a fused extraction's store: reducer results, the sample's store
# files nothing reads back (figures, pages, logs): not sealed
UNSEALED = (".png", ".svg", ".pdf", ".html", ".css", ".js", ".log", SIDECAR)
# a sealed directory's files above this size are checked by size when read (by checksum in verify)
HASH_BYTES = 64 << 20
RESULTS = "results"
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")  # a plain file-name component: not '.', '..', no '/'


class IntegrityError(ValueError):
    """A file a rule reads that is damaged, unsealed, out of range or incomplete; the message names it."""


def rebuild(path: str | Path) -> str:
    return f"delete {path} and rerun snakemake to rebuild it"


def file_checksum(path: str | Path, block: int = 8 << 20) -> str:
    h = hashlib.new(CHECKSUM)
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def sidecar(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR)


def sealable(path: str | Path) -> bool:
    return not Path(path).name.endswith(UNSEALED)


# --- writing -------------------------------------------------------------------------------------------


def seal(path: str | Path, digest_of: str | Path | None = None) -> Path:
    """Write ``<path>.sha256`` (atomically) with the checksum of ``digest_of`` (default ``path``; the writer's
    temporary file before its rename)."""
    path = Path(path)
    side = sidecar(path)
    tmp = side.with_name(f".{side.name}.tmp{os.getpid()}")
    tmp.write_text(f"{file_checksum(digest_of or path)}  {path.name}\n")
    os.replace(tmp, side)
    return side


def seal_dir(directory: str | Path) -> Path:
    """Write ``<directory>/checksums.json``: size and sha256 of every file below it."""
    directory = Path(directory)
    files = {
        str(p.relative_to(directory)): {"size": p.stat().st_size, CHECKSUM: file_checksum(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != DIR_SEAL
    }
    tmp = directory / f".{DIR_SEAL}.tmp{os.getpid()}"
    tmp.write_text(json.dumps({"checksum": CHECKSUM, "files": files}, indent=1) + "\n")
    os.replace(tmp, directory / DIR_SEAL)
    return directory / DIR_SEAL


def check_target(out: str | Path) -> Path:
    """Refuse to write (and so to remove) ``out`` unless it lies inside its own parent directory: its name a
    plain file-name component (a model named '..' would make its writer delete every model's cache)."""
    name = os.path.basename(os.fspath(out).rstrip("/"))  # before Path drops a trailing '.'
    out = Path(out)
    if not NAME.fullmatch(name) or out.resolve().parent != out.parent.resolve():
        raise IntegrityError(
            f"{out}: refusing to write or remove it: {name!r} is not a plain file name inside {out.parent}"
        )
    return out


def replace_dir(tmp: str | Path, out: str | Path, sealed: bool = True) -> Path:
    """Move a completed directory ``tmp`` to ``out`` (sealed first), replacing what was there; ``out`` checked by
    :func:`check_target` before anything is removed."""
    out = check_target(out)
    if sealed:
        seal_dir(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def check_name(name: str, what: str) -> str:
    """A model or corpus name must be a plain file-name component (it becomes a directory name) that does not
    start with '-' (it is given to commands: ``headatlas atlas NAME``)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise IntegrityError(
            f"config key {what}: {name!r} is not a plain file name (letters, digits, '_', '-', '.', not starting "
            "with '.'): outputs would be written outside their folder"
        )
    if name.startswith("-"):  # `headatlas atlas -x`, `snakemake results/.../-x` would read it as an option
        raise IntegrityError(
            f"config key {what}: {name!r} starts with '-', which commands read as an option: start it with a "
            "letter, digit or '_'"
        )
    return name


# --- checking ------------------------------------------------------------------------------------------


def _under_results(path: Path) -> bool:
    """Inside the run directory (``results/`` of the working directory: where the workflow writes)."""
    return Path(os.path.abspath(path)).is_relative_to(Path.cwd() / RESULTS)


def read_seal(side: str | Path) -> list[str] | None:
    """The words of a ``.sha256`` seal (checksum, file name); None when it is missing or unreadable (not a file,
    not ASCII text: a damaged seal reads as a missing one, so its file is rebuilt)."""
    try:
        return Path(side).read_bytes().decode("ascii").split()
    except (OSError, UnicodeDecodeError):
        return None


def file_problem(path: str | Path, required: bool | None = None) -> str | None:
    """What is wrong with a sealed file ([None] when it matches its seal). A file without a seal is a problem
    when ``required`` (default: a sealable file under results/); else it is not checked."""
    path = Path(path)
    side = sidecar(path)
    if not path.is_file():
        return f"{path}: missing; {rebuild(path)}"
    want = read_seal(side)
    if want is None:  # no seal, or one that is not text (random bytes): read as missing
        if required if required is not None else (sealable(path) and _under_results(path)):
            why = (
                "unreadable, not a checksum line"
                if side.exists()
                else "missing: written by hand or by an older headatlas"
            )
            return f"{path}: no checksum ({side.name} {why}); {rebuild(path)}"
        return None
    if len(want) != 2 or want[1] != path.name:
        return f"{side}: not a checksum of {path.name}; {rebuild(path)}"
    if file_checksum(path) != want[0]:
        return f"{path}: {CHECKSUM} differs from {side.name} (the file changed after it was written); {rebuild(path)}"
    return None


def dir_problems(directory: str | Path, full: bool = False) -> list[str]:
    """What is wrong with a sealed directory: a listed file missing or of another size, and the checksum of every
    file (``full``) or of those under :data:`HASH_BYTES`."""
    directory = Path(directory)
    try:
        files = json.loads((directory / DIR_SEAL).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{directory / DIR_SEAL}: unreadable ({e}); {rebuild(directory)}"]
    out = []
    for name, entry in files.items():
        f = directory / name
        if not f.is_file():
            out.append(f"{f}: missing (listed in {DIR_SEAL}); {rebuild(directory)}")
        elif f.stat().st_size != entry["size"]:
            out.append(f"{f}: {f.stat().st_size} bytes, {DIR_SEAL} says {entry['size']}; {rebuild(directory)}")
        elif (full or entry["size"] <= HASH_BYTES) and file_checksum(f) != entry[CHECKSUM]:
            out.append(f"{f}: {CHECKSUM} differs from {DIR_SEAL} (contents changed); {rebuild(directory)}")
    return out


def check_file(path: str | Path, required: bool | None = None) -> Path:
    problem = file_problem(path, required)
    if problem:
        raise IntegrityError(problem)
    return Path(path)


def check_dir(directory: str | Path) -> Path:
    problems = dir_problems(directory)
    if problems:
        raise IntegrityError("; ".join(problems[:3]))
    return Path(directory)


def check_inputs(paths: Iterable[str | Path]) -> None:
    """A rule's inputs before it reads them: every sealed file's checksum, every sealed directory's files.
    Attention stores (their manifest) are checked by their reader."""
    for p in map(Path, paths):
        if p.is_dir():
            if (p / DIR_SEAL).is_file():
                check_dir(p)
        elif sealable(p) and p.exists():
            check_file(p)


def walk_outputs(root: str | Path):
    """(directory, its file names) below ``root``, without attention stores (their manifest is their seal; listed
    once, with ``None`` for names), sealed directories (likewise), Snakemake's benchmarks and temporaries."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if ".tmp" not in n and not (d == root and n in SKIPPED))
        if MANIFEST in filenames or DIR_SEAL in filenames:
            yield d, None
            dirnames[:] = [n for n in dirnames if n not in NESTED] if MANIFEST in filenames else []
            continue
        yield d, sorted(n for n in filenames if not n.startswith(".") and sealable(n))


SKIPPED = ("benchmarks",)  # under results/: Snakemake's job timings


def damaged(root: str | Path = RESULTS) -> list[tuple[Path, str]]:
    """(output, problem) of every sealable file under ``root`` that does not match its seal or has none, and of
    every sealed directory whose files changed size; what the workflow reruns at planning time."""
    out = []
    for d, names in walk_outputs(root):
        if names is None:
            if (d / DIR_SEAL).is_file():
                problems = dir_problems(d)
                if problems:
                    out.append((d, problems[0]))
            continue
        for name in names:
            problem = file_problem(d / name, required=True)
            if problem:
                out.append((d / name, problem))
    return out


# --- values --------------------------------------------------------------------------------------------

# attention shares: sums of a row's cells, which stored maps may exceed 1 by rounding (core.store.ROW_SUM_TOL)
SHARE_RANGE = (0.0, 1.0 + 1e-2)
# column or array name -> (low, high) that every finite value must lie in (NaN allowed: "no value"); a name
# part alone, so that Q-composition columns (circ_q_in_z) and counts named q are not q-values, and differences of
# bounded values (accuracy_effect, share_diff) are not bounded themselves
RANGES = (
    (
        re.compile(
            r"(^|_)(share|frac|fraction|accuracy|p|pvalue|p_value|qvalue|stability)"
            r"(?!_(effect|drop|diff|delta|margin|change|minus))(_|$)"
        ),
        (0.0, 1.0),
    ),
    (re.compile(r"entropy"), (0.0, np.inf)),
)


def value_range(name: str) -> tuple[float, float] | None:
    for pattern, bounds in RANGES:
        if pattern.search(name):
            return bounds
    return None


def check_values(where: str | Path, arrays: dict, finite: Sequence[str] = (), ranges: dict | None = None) -> None:
    """Float values: never infinite; in ``ranges`` (name -> (low, high)) or else in :data:`RANGES` by name
    (shares, fractions, accuracies and p-values in [0, 1], entropies >= 0); the arrays named in ``finite``
    without NaN either."""
    for name, value in arrays.items():
        a = np.asarray(value)
        if a.dtype.kind != "f" or a.size == 0:
            continue
        bad = np.isinf(a) | (np.isnan(a) if name in finite else False)
        bounds = (ranges or {}).get(name) or value_range(str(name))
        if bounds is not None:
            with np.errstate(invalid="ignore"):
                bad |= (a < bounds[0]) | (a > bounds[1])
        if bad.any():
            first = a[bad].ravel()[0]
            want = f"in [{bounds[0]:g}, {bounds[1]:g}]" if bounds else "finite"
            raise IntegrityError(
                f"{where}: {int(bad.sum())} values of {name} are not {want} (first {first:.6g}); the file is "
                f"damaged or was computed wrongly: {rebuild(where)}"
            )


def read_table(path: str | Path, columns: Sequence[str] = (), rows: int | None = None, ranges: dict | None = None):
    """A TSV another rule wrote: sealed (checked), the ``columns`` present, ``rows`` rows when given, values in
    range (:func:`check_values`, ``ranges`` as there)."""
    import pandas as pd

    check_file(path)
    try:
        table = pd.read_csv(path, sep="\t")
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path}: not a readable table ({type(e).__name__}: {e}); {rebuild(path)}") from None
    check_table(path, table, columns, rows, ranges)
    return table


def check_table(
    path: str | Path, table, columns: Sequence[str] = (), rows: int | None = None, ranges: dict | None = None
) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise IntegrityError(f"{path}: missing columns {missing} (it has {list(table.columns)}); {rebuild(path)}")
    if rows is not None and len(table) != rows:
        raise IntegrityError(f"{path}: {len(table)} rows, expected {rows}; {rebuild(path)}")
    check_values(path, {c: table[c].to_numpy() for c in table.columns if table[c].dtype.kind == "f"}, ranges=ranges)


def check_unk_share(records, tokenizer, where: str, limit: float) -> float:
    """The share of a corpus's words the tokenizer turns into its unknown token; above ``limit`` an error naming
    the model directory (a tokenizer that lost its vocabulary)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    words = [w for r in records for w in r.words]
    if unk is None or not words or limit >= 1:
        return 0.0
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    n = sum(len(x) for x in ids)
    n_unk = [x.count(unk) for x in ids]
    share = sum(n_unk) / max(1, n)
    if share > limit:
        # a word longer than the tokenizer takes (WordPiece: max_input_chars_per_word) is one unknown token
        longest = getattr(getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None),
                          "max_input_chars_per_word", None)  # fmt: skip
        if longest:
            long = [i for i, (w, k) in enumerate(zip(words, n_unk)) if k and len(w) > longest]
            if long and (sum(n_unk) - sum(n_unk[i] for i in long)) / max(1, n) <= limit:
                where_word = [(r.id, j) for r in records for j in range(len(r.words))]
                rid, j = where_word[long[0]]
                raise IntegrityError(
                    f"{where}: {len(long)} word(s) longer than the tokenizer's {longest} characters per word become "
                    f"{tokenizer.unk_token!r}, {share:.1%} of the corpus's tokens (limit extraction.max_unk_share = "
                    f"{limit:g}); the first: record {rid!r}, word {j + 1} ({len(words[long[0]]):,} characters, "
                    f"{words[long[0]][:20]!r}...): split or remove it, or raise the limit"
                )
        raise IntegrityError(
            f"{where}: the tokenizer turns {share:.1%} of the corpus's tokens into {tokenizer.unk_token!r} "
            f"(limit extraction.max_unk_share = {limit:g}): is its tokenizer.json (or vocabulary file) missing or "
            "wrong?"
        )
    return share
