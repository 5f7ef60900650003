"""In-context learning tasks: input -> output word pairs built offline, and their 10-shot prompts.

Pairs come from UD English EWT's lemmas and morphological features (inflections, capitalisation,
first letter) and from the word lists of ``resources/icl/`` (antonyms, country capitals; sources and
licence in its README). A pair is usable for a model when its input and output are each one token of
the model's tokenizer with a leading space (Todd et al.'s ``prepend_space``).

Prompts follow Todd et al.'s template (their ``word_pairs_to_prompt_data`` defaults): the model's
BOS, then per demonstration ``"Q: " + x + "\\n" + "A: " + y + "\\n\\n"``, then ``"Q: " + x_q + "\\nA:"``;
the target is the first token of ``" " + y_q``. A corrupted prompt has the demonstrations' labels
permuted (``np.random.permutation``, as theirs; the query keeps its true target).
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.corpora import read_conllu

# task -> (upos, feature test) for the EWT inflection tasks: lemma -> inflected form
INFLECTIONS = {
    "past_tense": ("VERB", lambda f: "Tense=Past" in f and "VerbForm=Fin" in f),
    "present_participle": ("VERB", lambda f: "VerbForm=Ger" in f or ("Tense=Pres" in f and "VerbForm=Part" in f)),
    "third_person": ("VERB", lambda f: "Person=3" in f and "Number=Sing" in f and "Tense=Pres" in f),
    "plural": ("NOUN", lambda f: "Number=Plur" in f),
    "comparative": ("ADJ", lambda f: "Degree=Cmp" in f),
    "superlative": ("ADJ", lambda f: "Degree=Sup" in f),
}
DERIVED = {"singular": "plural"}  # task -> the inflection task it reverses
WORD_TASKS = ("capitalise", "first_letter")  # from the EWT's frequent lowercase lemmas
FILE_TASKS = ("antonym", "country_capital")  # resources/icl/<task>.tsv
TASKS = tuple(INFLECTIONS) + tuple(DERIVED) + WORD_TASKS + FILE_TASKS
WORD_LIST = 600  # the most frequent lowercase lemmas used by WORD_TASKS


class TaskError(ValueError):
    """A task file or task name that cannot be used; the message names the file and line or the key."""


def _word(w: str) -> bool:
    return w.isascii() and w.isalpha() and w.islower()


def ewt_pairs(paths: list[str | Path]) -> dict[str, list[tuple[str, str]]]:
    """task -> (input, output) pairs from EWT files: per lemma its most frequent form with the task's
    features (ties: the alphabetically first), where lemma and form differ; sorted by lemma."""
    forms: dict[str, dict[str, Counter]] = {t: defaultdict(Counter) for t in INFLECTIONS}
    lemmas: Counter = Counter()
    for path in paths:
        for s in read_conllu(path, invalid_trees="skip"):
            for form, lemma, upos, feats in zip(s.words, s.lemma, s.upos, s.feats):
                form = form.lower() if form.istitle() else form  # sentence-initial capitals
                if not (_word(form) and _word(lemma)):
                    continue
                if upos in ("NOUN", "VERB", "ADJ") and len(lemma) >= 3:
                    lemmas[lemma] += 1
                for task, (pos, test) in INFLECTIONS.items():
                    if upos == pos and form != lemma and test(feats):
                        forms[task][lemma][form] += 1
    out = {}
    for task in INFLECTIONS:
        out[task] = sorted((lem, min(c, key=lambda f: (-c[f], f))) for lem, c in forms[task].items())
    for task, source in DERIVED.items():
        seen: dict[str, str] = {}
        for lem, form in out[source]:
            seen.setdefault(form, lem)
        out[task] = sorted(seen.items())
    words = sorted(lemmas, key=lambda w: (-lemmas[w], w))[:WORD_LIST]
    out["capitalise"] = sorted((w, w.capitalize()) for w in words)
    out["first_letter"] = sorted((w, w[0]) for w in words)
    return out


def file_pairs(path: str | Path) -> list[tuple[str, str]]:
    """(input, output) pairs of a two-column TSV with the header ``input<TAB>output``; lines starting with
    '#' are comments. A malformed line is an error naming the file and line."""
    path = Path(path)
    pairs = []
    with open(path, newline="", encoding="utf-8") as f:
        rows = [(i, r) for i, r in enumerate(csv.reader(f, delimiter="\t"), 1) if r and not r[0].startswith("#")]
    if not rows or [c.strip() for c in rows[0][1]] != ["input", "output"]:
        raise TaskError(f"{path}: the first line must be the header 'input<TAB>output'")
    for lineno, row in rows[1:]:
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise TaskError(f"{path}:{lineno}: expected two non-empty tab-separated columns, got {row!r}")
        pairs.append((row[0].strip(), row[1].strip()))
    return pairs


def task_pairs(tasks: list[str], ewt: list[str | Path], word_files: dict[str, str | Path]) -> dict:
    """task -> its pairs, for the tasks named (from EWT files and the TSV of each file task)."""
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise TaskError(f"config key analysis.icl.tasks: unknown tasks {unknown}; known: {list(TASKS)}")
    built = ewt_pairs(ewt) if set(tasks) - set(FILE_TASKS) else {}
    out = {}
    for t in tasks:
        if t in FILE_TASKS:
            if t not in word_files:
                raise TaskError(f"task {t}: no word file given (resources/icl/{t}.tsv)")
            out[t] = file_pairs(word_files[t])
        else:
            out[t] = built[t]
    return out


def single_token_pairs(pairs: list[tuple[str, str]], tokenizer) -> list[tuple[str, str, int, int]]:
    """The pairs whose input and output are each one token with a leading space: (x, y, x id, y id)."""
    if not pairs:
        return []
    ids = [tokenizer(" " + w, add_special_tokens=False)["input_ids"] for p in pairs for w in p]
    return [(x, y, a[0], b[0]) for (x, y), a, b in zip(pairs, ids[::2], ids[1::2]) if len(a) == 1 and len(b) == 1]


@dataclass
class Prompts:
    """Token ids of one task's prompts (one list per prompt) and each prompt's target token id."""

    task: str
    ids: list[list[int]]
    target: np.ndarray


def prompt_text(demos: list[tuple[str, str]], query: str) -> str:
    """Todd et al.'s template (prefixes "Q:" and "A:", a leading space on every word)."""
    return "".join(f"Q: {x}\nA: {y}\n\n" for x, y in demos) + f"Q: {query}\nA:"


def build_prompts(
    task: str, pairs: list[tuple[str, str, int, int]], n: int, shots: int, tokenizer, bos: int | None,
    rng: np.random.Generator, shuffled: bool,
) -> Prompts:  # fmt: skip
    """``n`` prompts of ``shots`` demonstrations and a query, all distinct pairs of one prompt, drawn
    with ``rng``; ``shuffled``: the demonstrations' labels permuted."""
    if len(pairs) < shots + 1:
        raise TaskError(f"task {task}: {len(pairs)} usable pairs, a {shots}-shot prompt needs {shots + 1}")
    ids, target = [], []
    for _ in range(n):
        pick = rng.choice(len(pairs), shots + 1, replace=False)
        demos = [(pairs[i][0], pairs[i][1]) for i in pick[:shots]]
        if shuffled:
            labels = [demos[i][1] for i in rng.permutation(shots)]
            demos = [(x, y) for (x, _), y in zip(demos, labels)]
        q = pairs[pick[-1]]
        text = prompt_text(demos, q[0])
        tok = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.append(([bos] if bos is not None else []) + list(tok))
        target.append(q[3])
    return Prompts(task, ids, np.asarray(target, dtype=np.int64))
