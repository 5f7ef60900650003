"""SentEval's ten probing tasks (Conneau et al. 2018), regenerated from gold treebanks.

The SentEval probing files cannot be bundled, so the tasks are rebuilt from UD English
EWT and GUM (gold dependency trees) and GUM's constituency trees (the two tree tasks),
following SentEval's definitions:

==========================  ====================================================================
task                        label
==========================  ====================================================================
SentLen                     length bin of the sentence in words (6 bins: 5-8 ... 26-28)
WordContent                 which of a mid-frequency target vocabulary the sentence contains
                            (sentences with exactly one target-word token)
TreeDepth                   depth of the constituency tree (sampled flat over length bins)
TopConstituents             sequence of constituents under the sentence node, top-k + OTHER
BigramShift                 O = original, I = two adjacent words swapped
Tense                       PAST (VBD) / PRES (VBP, VBZ) of the main (root) verb
SubjNumber, ObjNumber       NN / NNS of the root's nominal subject / direct object
OddManOut                   O = original, C = a noun or verb replaced by a word of the same POS
                            and similar corpus frequency
CoordinationInversion       O = original, I = the two coordinated main clauses swapped
==========================  ====================================================================

Every split of a task comes from the same split of the sources (train from train, dev
from dev, test from test), so no test sentence of a treebank is ever trained on. Sampling
is deterministic: every source sentence has a seeded hash priority shared by all tasks, so
the tasks pick overlapping sentences and the union corpus stays small. Classes are
balanced as far as the data allow (water-filling). Where SentEval kept the target words of
train and test apart (Tense: the main verb, SubjNumber/ObjNumber: the noun, OddManOut: the
replacement word), train shares no such lemma with dev or test: dev and test are drawn
first and train avoids their lemmas; OddManOut's replacement words come from split-specific
vocabularies.

Each task item also has a *control* label in the spirit of Hewitt & Liang (2019): a fixed,
arbitrary function of a surface property (the lower-cased first word), whose classes keep
the task's train label distribution (see :func:`control_labels`). A probe can only reach it
by memorising the first-word -> label map from train.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..core.corpora import read_conllu, tsv_records
from ..core.data import Record
from ..core.settings import Settings
from .ptb import Tree, read_trees, top_constituents, tree_depth

PROBING_TASKS = (
    "SentLen",
    "WordContent",
    "TreeDepth",
    "TopConstituents",
    "BigramShift",
    "Tense",
    "SubjNumber",
    "ObjNumber",
    "OddManOut",
    "CoordinationInversion",
)
SPLITS = ("train", "dev", "test")
NOUN_VERB_TAGS = ("NN", "NNS", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ")
SUBJECTS = ("nsubj", "nsubj:pass", "nsubj:outer", "expl")
TABLE_COLUMNS = ["task", "split", "record", "label", "control", "source", "key", "detail"]


class GeneratorError(ValueError):
    pass


# --- sources ------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One gold-annotated source sentence (heads 0-based, -1 = ROOT)."""

    id: str
    split: str
    words: tuple[str, ...]
    upos: tuple[str, ...] = ()
    xpos: tuple[str, ...] = ()
    lemma: tuple[str, ...] = ()
    head: tuple[int, ...] = ()
    deprel: tuple[str, ...] = ()
    tree: Tree | None = None
    sent_id: str = ""

    @property
    def root(self) -> int:
        if self.head.count(-1) != 1:  # read_conllu rejects such sentences; this guards other sources
            raise GeneratorError(
                f"source sentence {self.sent_id!r} ({self.id}) has {self.head.count(-1)} roots; a tree has exactly one"
            )
        return self.head.index(-1)

    def children(self, i: int) -> list[int]:
        return [j for j, h in enumerate(self.head) if h == i]


def load_sources(treebanks: dict[str, dict[str, str]], trees: dict[str, dict[str, str]] | None = None) -> list[Source]:
    """Sentences of every treebank and split: ``treebanks[name][split] = conllu path``;
    ``trees[name][split]`` = bracketed file with one tree per sentence of that conllu file."""
    trees = trees or {}
    out: list[Source] = []
    for name in sorted(treebanks):
        for split in SPLITS:
            path = treebanks[name].get(split)
            if not path:
                continue
            sents = read_conllu(path)
            tree_list: list[Tree | None] = [None] * len(sents)
            tpath = trees.get(name, {}).get(split)
            if tpath:
                tree_list = read_trees(tpath)
                if len(tree_list) != len(sents):
                    raise GeneratorError(f"{tpath}: {len(tree_list)} trees for {len(sents)} sentences of {path}")
            for k, (s, t) in enumerate(zip(sents, tree_list)):
                if t is not None and len(t.leaves()) != len(s.words):
                    raise GeneratorError(
                        f"{tpath}: tree {k + 1} has {len(t.leaves())} words, {path} sentence {s.sent_id!r} has {len(s.words)}"
                    )
                out.append(
                    Source(
                        id=f"{name}-{split}-{k:05d}",
                        split=split,
                        words=tuple(s.words),
                        upos=tuple(s.upos),
                        xpos=tuple(s.xpos),
                        lemma=tuple(s.lemma),
                        head=tuple(h - 1 for h in s.head),
                        deprel=tuple(s.deprel),
                        tree=t,
                        sent_id=s.sent_id,
                    )
                )
    return out


def dedupe_sources(sources: Sequence[Source]) -> list[Source]:
    """Drop repeated sentences (same lower-cased words): a test copy wins over dev, dev over train."""
    rank = {s: i for i, s in enumerate(reversed(SPLITS))}
    best: dict[tuple[str, ...], Source] = {}
    for s in sources:
        key = tuple(w.lower() for w in s.words)
        other = best.get(key)
        if other is None or rank[s.split] < rank[other.split]:
            best[key] = s
    keep = {id(s) for s in best.values()}
    return [s for s in sources if id(s) in keep]


# --- deterministic randomness --------------------------------------------------------


def hash_unit(*parts) -> float:
    """A reproducible uniform number in [0, 1) from the parts (independent of order of use)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def hash_rng(*parts) -> np.random.Generator:
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(h, "big"))


# --- labels of the unmodified-sentence tasks ------------------------------------------


def length_bin(n: int, edges: Sequence[int]) -> str | None:
    """SentEval's SentLen bin of an n-word sentence: edges [5, 9, 13, 17, 21, 26, 29] give
    the bins 5-8, 9-12, 13-16, 17-20, 21-25, 26-28; None outside."""
    for lo, hi in zip(edges[:-1], edges[1:]):
        if lo <= n < hi:
            return f"{lo}-{hi - 1}"
    return None


TENSES = {"VBD": "PAST", "VBP": "PRES", "VBZ": "PRES"}


def main_tense(s: Source) -> str | None:
    """PAST (VBD) or PRES (VBP, VBZ) of the main clause's finite verb: the root when it is
    finite, else the root's single finite ``aux``/``cop`` dependent; None otherwise
    (modals, imperatives, fragments)."""
    r = s.root
    if s.upos[r] in ("VERB", "AUX") and s.xpos[r] in TENSES:
        return TENSES[s.xpos[r]]
    finite = [
        j for j in s.children(r) if s.deprel[j] in ("aux", "aux:pass", "cop") and s.xpos[j] in TENSES | {"MD": ""}
    ]
    if len(finite) != 1 or s.xpos[finite[0]] == "MD":
        return None
    return TENSES[s.xpos[finite[0]]]


def _root_dependent(s: Source, relations: Iterable[str]) -> int | None:
    found = [j for j in s.children(s.root) if s.deprel[j] in relations]
    return found[0] if len(found) == 1 else None


def subject_number(s: Source) -> tuple[str, str] | None:
    """(NN or NNS, lemma) of the root's single nominal subject, else None."""
    j = _root_dependent(s, SUBJECTS)
    if j is None or s.xpos[j] not in ("NN", "NNS"):
        return None
    return s.xpos[j], s.lemma[j].lower()


def object_number(s: Source) -> tuple[str, str] | None:
    """(NN or NNS, lemma) of the root's single direct object, else None."""
    j = _root_dependent(s, ("obj",))
    if j is None or s.xpos[j] not in ("NN", "NNS"):
        return None
    return s.xpos[j], s.lemma[j].lower()


# --- modifications ---------------------------------------------------------------------


def shift_positions(s: Source) -> list[int]:
    """Positions i where words i and i+1 may be swapped: neither is punctuation and they differ."""
    return [
        i
        for i in range(len(s.words) - 1)
        if s.upos[i] != "PUNCT" and s.upos[i + 1] != "PUNCT" and s.words[i].lower() != s.words[i + 1].lower()
    ]


def bigram_shift(words: Sequence[str], i: int) -> tuple[str, ...]:
    w = list(words)
    w[i], w[i + 1] = w[i + 1], w[i]
    return tuple(w)


def _subtree(s: Source, i: int) -> list[int]:
    kids = defaultdict(list)
    for j, h in enumerate(s.head):
        kids[h].append(j)
    out, stack = [], [i]
    while stack:
        k = stack.pop()
        out.append(k)
        stack.extend(kids[k])
    return sorted(out)


def _recase(word: str, xpos: str, upper: bool) -> str:
    if upper:
        return word[:1].upper() + word[1:]
    if xpos in ("NNP", "NNPS") or word == "I" or (len(word) > 1 and word.isupper()):
        return word
    return word[:1].lower() + word[1:]


def coordination_inversion(s: Source) -> tuple[str, ...] | None:
    """The sentence with its two coordinated main clauses swapped, or None.

    Applies when the root has its own subject and exactly one ``conj`` dependent, that
    conjunct has its own subject and a ``cc``, its subtree is contiguous, and only
    punctuation follows it. "They left , but we stayed ." becomes "We stayed , but they
    left ." (the first letter's case moves with the sentence start).
    """
    r = s.root
    if _root_dependent(s, SUBJECTS) is None:
        return None
    conjs = [j for j in s.children(r) if s.deprel[j] == "conj"]
    if len(conjs) != 1:
        return None
    c = conjs[0]
    kids = s.children(c)
    if not any(s.deprel[k] in SUBJECTS for k in kids) or not any(s.deprel[k] == "cc" for k in kids):
        return None
    span = _subtree(s, c)
    a, b = span[0], span[-1]
    if span != list(range(a, b + 1)) or not r < a:
        return None
    if any(s.upos[k] != "PUNCT" for k in range(b + 1, len(s.words))):
        return None
    k = a
    while k <= b and (s.upos[k] == "PUNCT" or s.deprel[k] == "cc"):
        k += 1
    if k > b or not any(s.deprel[j] == "cc" for j in range(a, k)):
        return None
    w, x = list(s.words), s.xpos
    upper = w[0][:1].isupper()
    first = [_recase(w[0], x[0], False)] + w[1:a]
    second = [_recase(w[k], x[k], upper)] + w[k + 1 : b + 1]
    out = tuple(second + w[a:k] + first + w[b + 1 :])
    return out if out != s.words else None


@dataclass
class Lexicon:
    """Word-form counts from the train sources, each form's most frequent tag, and the split
    each form may serve as an OddManOut replacement in (train 60%, dev 20%, test 20%)."""

    count: dict[str, int]
    tag: dict[str, str]
    by_tag: dict[tuple[str, str], tuple[list[float], list[str]]] = field(default_factory=dict)

    @classmethod
    def build(cls, sources: Sequence[Source], seed: int, min_count: int) -> "Lexicon":
        count: Counter = Counter()
        tags: dict[str, Counter] = defaultdict(Counter)
        for s in sources:
            if s.split != "train":
                continue
            for w, t in zip(s.words, s.xpos):
                lw = w.lower()
                count[lw] += 1
                tags[lw][t] += 1
        tag = {w: c.most_common(1)[0][0] for w, c in tags.items()}
        lex = cls(dict(count), tag)
        groups: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
        for w, n in count.items():
            if n < min_count or not w.isalpha() or tag[w] not in NOUN_VERB_TAGS:
                continue
            u = hash_unit(seed, "somo-split", w)
            split = "train" if u < 0.6 else "dev" if u < 0.8 else "test"
            groups[(tag[w], split)].append((math.log(n), w))
        for key, items in groups.items():
            items.sort()
            lex.by_tag[key] = ([v for v, _ in items], [w for _, w in items])
        return lex

    def replacements(self, word: str, tag: str, split: str, max_ratio: float) -> list[str]:
        """Forms of the same tag, usable in ``split``, whose train count is within a factor
        ``max_ratio`` of ``word``'s."""
        logs, forms = self.by_tag.get((tag, split), ([], []))
        f = math.log(max(self.count.get(word.lower(), 0), 1))
        lo, hi = bisect_left(logs, f - math.log(max_ratio)), bisect_right(logs, f + math.log(max_ratio))
        return [w for w in forms[lo:hi] if w != word.lower()]


def somo_targets(s: Source, lex: Lexicon, max_ratio: float) -> list[tuple[int, list[str]]]:
    """(position, replacement candidates) of every noun or verb that can be replaced."""
    out = []
    for i, (w, t) in enumerate(zip(s.words, s.xpos)):
        if t in NOUN_VERB_TAGS and w.isalpha():
            cands = [r for r in lex.replacements(w, t, s.split, max_ratio) if r != s.lemma[i].lower()]
            if cands:
                out.append((i, cands))
    return out


def odd_man_out(words: Sequence[str], i: int, replacement: str) -> tuple[str, ...]:
    w = list(words)
    w[i] = replacement[:1].upper() + replacement[1:] if w[i][:1].isupper() else replacement
    return tuple(w)


# --- balanced, split-disjoint sampling ---------------------------------------------------


def quotas(available: dict[str, int], total: int) -> dict[str, int]:
    """Per-class counts summing to min(total, sum(available)), as equal as the data allow."""
    labels = sorted(available, key=lambda c: (available[c], c))
    q, remaining = {}, total
    for i, c in enumerate(labels):
        q[c] = min(available[c], remaining // (len(labels) - i))
        remaining -= q[c]
    while remaining > 0:
        spare = [c for c in sorted(available) if q[c] < available[c]]
        if not spare:
            break
        for c in spare[:remaining]:
            q[c] += 1
            remaining -= 1
    return q


def spread(items: list, key) -> list:
    """Interleave items round-robin over the groups of ``key`` (each group keeps its order)."""
    groups: dict = defaultdict(list)
    for it in items:
        groups[key(it)].append(it)
    order = sorted(groups)
    out = []
    for k in range(max((len(g) for g in groups.values()), default=0)):
        out += [groups[g][k] for g in order if k < len(groups[g])]
    return out


def take_balanced(candidates: list[tuple[str, str, "object"]], total: int, exclude: set[str] = frozenset()) -> list:
    """From (label, key, payload) candidates in priority order, skip excluded keys and take
    the first items of each label up to balanced quotas."""
    by_label: dict[str, list] = defaultdict(list)
    for label, key, payload in candidates:
        if key and key in exclude:
            continue
        by_label[label].append((label, key, payload))
    q = quotas({c: len(v) for c, v in by_label.items()}, total)
    return [it for c in sorted(by_label) for it in by_label[c][: q[c]]]


# --- the generator ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig(Settings):
    """analysis.jomyaeng.generator (workflow/schemas/jomyaeng.schema.yaml): the ten probing tasks' corpora."""

    SECTION = "analysis.jomyaeng.generator"
    CONVERT = {"sizes": lambda v: tuple((s, int(v[s])) for s in SPLITS)}  # {split: size} in split order

    seed: int = 123
    sizes: tuple[tuple[str, int], ...] = (("train", 1000), ("dev", 250), ("test", 250))
    min_words: int = 5
    max_words: int = 28
    length_bins: tuple[int, ...] = (5, 9, 13, 17, 21, 26, 29)
    wc_words: int = 30
    wc_band: tuple[int, int] = (100, 2000)
    depth_range: tuple[int, int] = (5, 12)
    n_top: int = 9
    somo_max_ratio: float = 2.0
    somo_min_count: int = 3
    tasks: tuple[str, ...] = PROBING_TASKS

    def __post_init__(self):
        bad = sorted(set(self.tasks) - set(PROBING_TASKS))
        if bad:
            raise GeneratorError(f"generator.tasks: unknown tasks {bad}; known: {list(PROBING_TASKS)}")

    def size(self, split: str) -> int:
        return dict(self.sizes)[split]


@dataclass(frozen=True)
class Item:
    task: str
    split: str
    record: str
    words: tuple[str, ...]
    label: str
    source: str
    key: str = ""
    detail: str = ""


def _original(task: str, s: Source, label: str, key: str = "", detail: str = "") -> Item:
    return Item(task, s.split, s.id, s.words, label, s.id, key, detail)


def word_content_vocabulary(sources: Sequence[Source], cfg: GeneratorConfig) -> list[str]:
    """Target words: alphabetic lower-cased forms ranked ``wc_band`` by train frequency that
    occur (once) in enough sentences of every split; ``wc_words`` of them picked at random
    (seeded) among those that qualify. Items are then the sentences with exactly one token
    of the chosen vocabulary."""
    count: Counter = Counter(w.lower() for s in sources if s.split == "train" for w in s.words)
    ranked = [w for w, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0])) if w.isalpha() and len(w) >= 3]
    band = set(ranked[cfg.wc_band[0] : cfg.wc_band[1]])
    per_split = {sp: Counter() for sp in SPLITS}
    for s in sources:
        if cfg.min_words <= len(s.words) <= cfg.max_words:
            once = Counter(w.lower() for w in s.words if w.lower() in band)
            per_split[s.split].update(w for w, c in once.items() if c == 1)
    need = {sp: math.ceil(cfg.size(sp) / cfg.wc_words) for sp in SPLITS}
    ok = sorted(w for w in band if all(per_split[sp][w] >= need[sp] for sp in SPLITS))
    if len(ok) < cfg.wc_words:
        raise GeneratorError(
            f"WordContent: only {len(ok)} words of frequency ranks {cfg.wc_band} occur in enough sentences "
            f"({need} per split) for wc_words={cfg.wc_words}; lower wc_words or the sizes, or widen wc_band"
        )
    rng = np.random.default_rng(cfg.seed)
    return sorted(rng.choice(ok, size=cfg.wc_words, replace=False).tolist())


def _candidates(task: str, s: Source, cfg: GeneratorConfig, ctx: dict) -> list[tuple[str, str, Item]] | None:
    """(label, disjointness key, item) candidates of one source sentence for ``task``."""
    n = len(s.words)
    if task == "SentLen":
        label = length_bin(n, cfg.length_bins)
        return [(label, "", _original(task, s, label))] if label else None
    if task == "WordContent":
        hits = [w.lower() for w in s.words if w.lower() in ctx["wc_vocab"]]
        return [(hits[0], "", _original(task, s, hits[0]))] if len(hits) == 1 else None
    if task in ("TreeDepth", "TopConstituents"):
        if s.tree is None:
            return None
        if task == "TreeDepth":
            d = tree_depth(s.tree)
            if not cfg.depth_range[0] <= d <= cfg.depth_range[1]:
                return None
            return [(str(d), "", _original(task, s, str(d)))]
        top = top_constituents(s.tree)
        label = top if top in ctx["top_classes"] else "OTHER"
        return [(label, "", _original(task, s, label, detail=top))]
    if task == "Tense":
        label = main_tense(s)
        key = s.lemma[s.root].lower()
        return [(label, key, _original(task, s, label, key))] if label else None
    if task in ("SubjNumber", "ObjNumber"):
        got = subject_number(s) if task == "SubjNumber" else object_number(s)
        return [(got[0], got[1], _original(task, s, got[0], got[1]))] if got else None
    rng = hash_rng(cfg.seed, task, s.id)
    if task == "BigramShift":
        pos = shift_positions(s)
        if not pos:
            return None
        i = int(rng.choice(pos))
        mod = Item(task, s.split, s.id + ".bshift", bigram_shift(s.words, i), "I", s.id, "", f"swap {i} {i + 1}")
        return [("O", "", _original(task, s, "O")), ("I", "", mod)]
    if task == "OddManOut":
        targets = somo_targets(s, ctx["lexicon"], cfg.somo_max_ratio)
        if not targets:
            return None
        i, cands = targets[int(rng.integers(len(targets)))]
        r = str(cands[int(rng.integers(len(cands)))])
        mod = Item(
            task, s.split, s.id + ".somo", odd_man_out(s.words, i, r), "C", s.id, r, f"replace {i} {s.words[i]} -> {r}"
        )
        return [("O", "", _original(task, s, "O")), ("C", "", mod)]
    if task == "CoordinationInversion":
        inv = coordination_inversion(s)
        if inv is None:
            return None
        mod = Item(task, s.split, s.id + ".coordinv", inv, "I", s.id)
        return [("O", "", _original(task, s, "O")), ("I", "", mod)]
    raise GeneratorError(f"unknown probing task {task!r}")


MODIFIED = {"BigramShift", "OddManOut", "CoordinationInversion"}
# most constrained first, so that later tasks can reuse their sentences
GENERATION_ORDER = (
    "CoordinationInversion",
    "TreeDepth",
    "TopConstituents",
    "Tense",
    "ObjNumber",
    "SubjNumber",
    "WordContent",
    "OddManOut",
    "BigramShift",
    "SentLen",
)
DISJOINT = {"Tense", "SubjNumber", "ObjNumber"}


def generate_task(
    task: str, sources: Sequence[Source], cfg: GeneratorConfig, ctx: dict, prefer: set[str] = frozenset()
) -> list[Item]:
    """The items of one task over the three splits (train last, for lemma disjointness).
    Sentences are taken in seeded priority order, those in ``prefer`` (already used by
    another task) first, so the tasks share sentences and the union corpus stays small."""
    order = sorted(sources, key=lambda s: (s.id not in prefer, hash_unit(cfg.seed, "priority", s.id)))
    items: list[Item] = []
    used: set[str] = set()
    for split in reversed(SPLITS):
        pool = [s for s in order if s.split == split and cfg.min_words <= len(s.words) <= cfg.max_words]
        total = cfg.size(split)
        if task in MODIFIED:
            # each eligible sentence appears once: the first `total` eligible ones, half modified
            chosen = []
            for s in pool:
                c = _candidates(task, s, cfg, ctx)
                if c:
                    chosen.append(c)
                if len(chosen) == total:
                    break
            flip = sorted(range(len(chosen)), key=lambda k: hash_unit(cfg.seed, task, "flip", chosen[k][0][2].source))
            modified = set(flip[: len(chosen) // 2])
            items += [c[1][2] if k in modified else c[0][2] for k, c in enumerate(chosen)]
            continue
        cands = []
        for s in pool:
            c = _candidates(task, s, cfg, ctx)
            if c:
                cands += c
        if task == "TreeDepth":  # flatten sentence length within each depth class
            cands = spread(cands, key=lambda c: length_bin(len(c[2].words), cfg.length_bins) or "")
        picked = take_balanced(cands, total, used if task in DISJOINT and split == "train" else set())
        items += [p[2] for p in picked]
        used |= {p[1] for p in picked if p[1]}
    return items


def control_labels(items: Sequence[Item], seed: int) -> list[str]:
    """Hewitt & Liang-style control labels: every lower-cased first word is one type with one
    label. Types are dealt out in order of train frequency (ties: seeded random) to the class
    furthest below its share of the task's train label distribution, so the control task's
    class balance matches the task's despite a few very frequent first words; types that
    never start a train item get a seeded random class drawn from that distribution."""
    out = [""] * len(items)
    by_task: dict[str, list[int]] = defaultdict(list)
    for k, it in enumerate(items):
        by_task[it.task].append(k)
    for task, ks in by_task.items():
        train = Counter(items[k].label for k in ks if items[k].split == "train") or Counter(items[k].label for k in ks)
        labels = sorted(train)
        share = np.array([train[c] for c in labels], dtype=float) / sum(train.values())
        first = {k: items[k].words[0].lower() for k in ks}
        freq = Counter(first[k] for k in ks if items[k].split == "train")
        assigned: dict[str, str] = {}
        totals = np.zeros(len(labels))
        for w in sorted(freq, key=lambda w: (-freq[w], hash_unit(seed, "control-order", task, w))):
            deficit = share * (totals.sum() + freq[w]) - totals
            best = np.flatnonzero(deficit == deficit.max())
            c = best[int(hash_unit(seed, "control-tie", task, w) * len(best))]
            assigned[w] = labels[c]
            totals[c] += freq[w]
        cdf = np.cumsum(share)
        for k in ks:
            w = first[k]
            if w not in assigned:
                u = hash_unit(seed, "control", task, w)
                assigned[w] = labels[min(int(np.searchsorted(cdf, u, side="right")), len(labels) - 1)]
            out[k] = assigned[w]
    return out


def generate(sources: Sequence[Source], cfg: GeneratorConfig) -> tuple[list[Record], pd.DataFrame]:
    """All tasks: the union corpus (one record per distinct sentence) and the task table."""
    sources = dedupe_sources(sources)
    ctx: dict = {}
    if "WordContent" in cfg.tasks:
        ctx["wc_vocab"] = set(word_content_vocabulary(sources, cfg))
    if "TopConstituents" in cfg.tasks:
        tops = Counter(
            top_constituents(s.tree)
            for s in sources
            if s.split == "train" and s.tree is not None and cfg.min_words <= len(s.words) <= cfg.max_words
        )
        ctx["top_classes"] = {t for t, _ in sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.n_top]}
    if "OddManOut" in cfg.tasks:
        ctx["lexicon"] = Lexicon.build(sources, cfg.seed, cfg.somo_min_count)
    items: list[Item] = []
    used: set[str] = set()
    for task in sorted(cfg.tasks, key=GENERATION_ORDER.index):
        got = generate_task(task, sources, cfg, ctx, used)
        if not got:
            raise GeneratorError(f"task {task}: no sentence qualifies")
        items += got
        used |= {it.source for it in got}
    rank = {t: k for k, t in enumerate(cfg.tasks)}
    items.sort(key=lambda it: rank[it.task])  # stable: each task keeps its own order
    records: dict[str, Record] = {}
    split_of = {s.id: s.split for s in sources}
    for it in items:
        if it.record in records:
            if records[it.record].words != it.words:
                raise GeneratorError(f"record {it.record}: two different word sequences")
            continue
        records[it.record] = Record(
            id=it.record, words=it.words, segment=(0,) * len(it.words), split=split_of[it.source]
        )
    table = pd.DataFrame(
        {
            "task": [i.task for i in items],
            "split": [i.split for i in items],
            "record": [i.record for i in items],
            "label": [i.label for i in items],
            "control": control_labels(items, cfg.seed),
            "source": [i.source for i in items],
            "key": [i.key for i in items],
            "detail": [i.detail for i in items],
        },
        columns=TABLE_COLUMNS,
    )
    return list(records.values()), table


def task_stats(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and split: size, number of classes, majority share, and the class counts."""
    rows = []
    for (task, split), g in table.groupby(["task", "split"], sort=False):
        counts = g["label"].value_counts()
        rows.append(
            {
                "task": task,
                "split": split,
                "n": len(g),
                "classes": len(counts),
                "majority": counts.iloc[0] / len(g),
                "min_class": int(counts.min()),
                "max_class": int(counts.max()),
                "control_majority": g["control"].value_counts().iloc[0] / len(g),
                "counts": ";".join(f"{k}:{v}" for k, v in sorted(counts.items())),
            }
        )
    return pd.DataFrame(rows)


# --- downstream tasks --------------------------------------------------------------------


@dataclass(frozen=True)
class DownstreamSpec:
    """A SentEval-style transfer task from TSV files: classification (accuracy) or
    relatedness (a score in ``score_range``, Pearson r)."""

    name: str
    kind: str
    paths: tuple[tuple[str, str], ...]
    text_columns: int
    label_column: int
    sizes: tuple[tuple[str, int], ...] = (("train", 0), ("dev", 0), ("test", 0))
    score_range: tuple[float, float] = (1.0, 5.0)

    @classmethod
    def from_config(cls, name: str, p: dict) -> "DownstreamSpec":
        if p.get("kind") not in ("classification", "relatedness"):
            raise GeneratorError(f"downstream.{name}.kind: 'classification' or 'relatedness', not {p.get('kind')!r}")
        missing = [s for s in SPLITS if s not in p]
        if missing:
            raise GeneratorError(f"downstream.{name}: missing paths for splits {missing}")
        sizes = p.get("sizes", {})
        return cls(
            name=name,
            kind=p["kind"],
            paths=tuple((s, p[s]) for s in SPLITS),
            text_columns=int(p["text_columns"]),
            label_column=int(p["label_column"]),
            sizes=tuple((s, int(sizes.get(s, 0))) for s in SPLITS),
            score_range=tuple(p.get("score_range", (1.0, 5.0))),
        )


def downstream_id(words: Sequence[str]) -> str:
    return "ds-" + hashlib.blake2b(" ".join(words).encode(), digest_size=6).hexdigest()


def generate_downstream(specs: Sequence[DownstreamSpec], seed: int) -> tuple[list[Record], pd.DataFrame]:
    """One record per distinct sentence (a pair's sentences are separate records, as
    SentEval encodes them separately) and a table task/split/item/record_a/record_b/label.
    ``sizes`` keep a seeded random subset of each split (0 = all); the choice depends on the
    item's text only, so two tasks over the same pairs (SICK-E, SICK-R) keep the same ones."""
    records: dict[str, Record] = {}
    rows = []
    for spec in specs:
        for split, path in spec.paths:
            recs = tsv_records(path, spec.text_columns, spec.label_column, prefix=f"{spec.name}-{split}")
            order = sorted(range(len(recs)), key=lambda k: hash_unit(seed, split, " ".join(recs[k].words), k))
            n = dict(spec.sizes)[split]
            keep = sorted(order[:n] if n else order)
            for k in keep:
                r = recs[k]
                ids = []
                for words in r.segment_words():
                    rid = downstream_id(words)
                    records.setdefault(rid, Record(id=rid, words=tuple(words), segment=(0,) * len(words), split=split))
                    ids.append(rid)
                if spec.kind == "relatedness":
                    try:
                        score = float(r.label)
                    except ValueError:
                        raise GeneratorError(
                            f"{path}: item {r.id}: relatedness score {r.label!r} is not a number"
                        ) from None
                    lo, hi = spec.score_range
                    if not lo <= score <= hi:
                        raise GeneratorError(f"{path}: item {r.id}: score {score} outside {spec.score_range}")
                rows.append(
                    {
                        "task": spec.name,
                        "kind": spec.kind,
                        "split": split,
                        "item": r.id,
                        "record_a": ids[0],
                        "record_b": ids[1] if len(ids) > 1 else "",
                        "label": r.label,
                    }
                )
    return list(records.values()), pd.DataFrame(rows)


def downstream_stats(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, split), g in table.groupby(["task", "split"], sort=False):
        if g["kind"].iloc[0] == "relatedness":
            v = g["label"].astype(float)
            desc, classes, maj = f"mean {v.mean():.2f}, sd {v.std():.2f}", 0, float("nan")
        else:
            counts = g["label"].value_counts()
            desc, classes, maj = (
                ";".join(f"{k}:{v}" for k, v in sorted(counts.items())),
                len(counts),
                counts.iloc[0] / len(g),
            )
        rows.append({"task": task, "split": split, "n": len(g), "classes": classes, "majority": maj, "counts": desc})
    return pd.DataFrame(rows)


def read_table(path: str | Path) -> pd.DataFrame:
    """A task table written by the generator (keeps labels as strings)."""
    return pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
