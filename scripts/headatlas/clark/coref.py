"""A coreference head (Clark et al. 2019, Sec. 4.3, Table 2) on OntoGUM documents.

Documents are truncated to the model's input length at extraction; only mentions that lie
entirely within the kept words count. A mention's head is the word of its span whose gold
dependency head lies outside the span (the first such word; ROOT counts as outside).
Mentions are ordered by (first word, last word); the candidates of a mention are the gold
mentions that end before it starts; an *anaphor* is a mention with a coreferent candidate.

Predictions are head words. An attention head predicts the candidate head word that receives
the most attention from the anaphor's head word, argmax_c A[h_m, h_c] on Clark's word-level
map (none, and wrong, when no candidate gets any weight); the prediction is correct when a candidate with that head word is in the anaphor's
cluster (candidates that share a head word cannot be told apart by attention).

Baselines on the same anaphors and candidates (the nearest candidate is the one that ends
last, then starts last):
- nearest: the nearest candidate;
- head match: the nearest candidate with the same head word (lower-cased), else the nearest;
- rule-based: the nearest candidate passing the first sieve that any candidate passes:
  exact string (lower-cased span), head match, number/gender/person agreement, any.

Agreement uses the head word's FEATS (Number, Person, Gender) with a small pronoun lexicon
where FEATS are empty; nouns are third person; an unknown value agrees with everything.

Anaphor types from the head word's UPOS: PRON -> pronoun, PROPN -> proper, else nominal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..core.data import Record
from ..core.figures import head_label
from ..core.settings import Settings
from .syntax import WordMaps, sentence_ci, word_block

TYPES = ("pronoun", "proper", "nominal")
BASELINES = ("Nearest", "Head match", "Rule-based")

# Clark et al. 2019 Table 2 (CoNLL-2012, documents truncated to 128 tokens), as printed in %.
PAPER_TABLE2 = pd.DataFrame(
    [
        ("Nearest", 27, 29, 29, 19),
        ("Head match", 52, 47, 67, 40),
        ("Rule-based", 69, 70, 77, 60),
        ("Neural coref", 83, np.nan, np.nan, np.nan),
        ("Best head", 65, 64, 73, 58),
    ],
    columns=["system", "paper_all", "paper_pronoun", "paper_proper", "paper_nominal"],
)
# the paper prints percentages; every accuracy column here is a fraction in [0, 1]
_PAPER_COLS = ["paper_all", "paper_pronoun", "paper_proper", "paper_nominal"]
PAPER_TABLE2[_PAPER_COLS] = (PAPER_TABLE2[_PAPER_COLS] / 100).round(4)

# person, number, gender of pronouns whose FEATS may be empty
PRONOUNS = {
    **{w: ("1", "Sing", None) for w in ("i", "me", "my", "mine", "myself")},
    **{w: ("1", "Plur", None) for w in ("we", "us", "our", "ours", "ourselves")},
    **{w: ("2", None, None) for w in ("you", "your", "yours", "yourself", "yourselves")},
    **{w: ("3", "Sing", "Masc") for w in ("he", "him", "his", "himself")},
    **{w: ("3", "Sing", "Fem") for w in ("she", "her", "hers", "herself")},
    **{w: ("3", "Sing", "Neut") for w in ("it", "its", "itself")},
    **{w: ("3", "Plur", None) for w in ("they", "them", "their", "theirs", "themselves")},
}


@dataclass(frozen=True)
class Mention:
    first: int
    last: int
    cluster: int
    head: int  # record word index of the mention's head word
    kind: str  # pronoun / proper / nominal


def mention_head(record: Record, first: int, last: int) -> int:
    """The first word of [first, last] whose gold head lies outside the span (or ROOT)."""
    heads = np.asarray(record.head[first : last + 1])
    outside = np.flatnonzero((heads < first) | (heads > last))
    return first + int(outside[0]) if len(outside) else last


def mention_kind(upos: str) -> str:
    return "pronoun" if upos == "PRON" else "proper" if upos == "PROPN" else "nominal"


def document_mentions(record: Record, n_words: int) -> list[Mention]:
    """The record's gold mentions that lie within the first ``n_words`` words, in order."""
    if not record.head or not record.upos:
        raise ValueError(f"record {record.id!r} has no heads/UPOS; Table 2 needs a conllu_documents corpus")
    out = []
    for first, last, cluster in sorted(record.mentions):
        if last < n_words:
            h = mention_head(record, first, last)
            out.append(Mention(first, last, cluster, h, mention_kind(record.upos[h])))
    return out


def features(record: Record, word: int) -> tuple[str | None, str | None, str | None]:
    """(person, number, gender) of a head word; None = unknown."""
    feats = dict(f.split("=", 1) for f in record.feats[word].split("|") if "=" in f) if record.feats else {}
    lex = (
        PRONOUNS.get(record.words[word].lower(), (None, None, None))
        if record.upos[word] == "PRON"
        else ("3", None, None)
    )
    person = feats.get("Person", lex[0])
    number = feats.get("Number", lex[1])
    gender = feats.get("Gender", lex[2])
    return person, number, gender


def agree(a, b) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b))


@dataclass
class Anaphors:
    """One row per anaphor: its document, split and type, its candidates' head words and
    which of them are right."""

    doc: list[str]
    split: list[str]
    kind: list[str]
    head: list[int]
    candidates: list[np.ndarray]  # distinct candidate head words, in text order
    right: list[np.ndarray]  # bool per candidate head word
    baselines: list[np.ndarray]  # predicted head word per baseline


def nearest(cands: Sequence[Mention]) -> Mention:
    return max(cands, key=lambda c: (c.last, c.first))


def baseline_predictions(record: Record, m: Mention, cands: Sequence[Mention]) -> list[int]:
    """Head word predicted by each of :data:`BASELINES` for anaphor m."""
    low = [w.lower() for w in record.words]
    text = lambda x: " ".join(low[x.first : x.last + 1])  # noqa: E731
    near = nearest(cands)
    same_head = [c for c in cands if low[c.head] == low[m.head]]
    head_match = nearest(same_head) if same_head else near
    fm = features(record, m.head)
    sieves = (
        [c for c in cands if text(c) == text(m)],
        same_head,
        [c for c in cands if agree(features(record, c.head), fm)],
        list(cands),
    )
    rule = nearest(next(s for s in sieves if s))
    return [near.head, head_match.head, rule.head]


def document_anaphors(record: Record, n_words: int, split: str, out: Anaphors) -> list[int]:
    """Append the anaphors of one document to ``out``; return their indices in ``out``."""
    mentions = document_mentions(record, n_words)
    added = []
    for i, m in enumerate(mentions):
        cands = [c for c in mentions[:i] if c.last < m.first]
        if not any(c.cluster == m.cluster for c in cands):
            continue
        words = np.array(sorted({c.head for c in cands}))
        right = np.array([any(c.cluster == m.cluster and c.head == w for c in cands) for w in words])
        out.doc.append(record.id)
        out.split.append(split)
        out.kind.append(m.kind)
        out.head.append(m.head)
        out.candidates.append(words)
        out.right.append(right)
        out.baselines.append(np.array(baseline_predictions(record, m, cands)))
        added.append(len(out.doc) - 1)
    return added


def attention_correct(
    wm: WordMaps, n_words: int, heads: Sequence[int], candidates: Sequence[np.ndarray], right: Sequence[np.ndarray]
) -> np.ndarray:
    """[A, K] whether each head's most-attended candidate head word is right, for the
    anaphors of one document (head word -> candidate head words, on word-level maps)."""
    block = word_block(wm, n_words)
    w = block.maps.shape[1]
    n = len(heads)
    rows = block.position[np.asarray(heads, dtype=np.int64)] if n else np.zeros(0, dtype=np.int64)
    cand = np.zeros((n, w), dtype=bool)
    good = np.zeros((n, w), dtype=bool)
    for a, (cw, ok) in enumerate(zip(candidates, right)):
        pos = block.position[cw]
        cand[a, pos[pos >= 0]] = True
        good[a, pos[(pos >= 0) & ok]] = True
    valid = rows >= 0
    scores = np.where(cand[None], block.maps[:, np.where(valid, rows, 0), :], -np.inf)  # [K, A, W]
    best = scores.argmax(-1)  # [K, A]
    hit = good[np.arange(n)[None, :], best]  # [K, A]
    positive = np.take_along_axis(scores, best[..., None], -1)[..., 0] > 0  # no weight: no prediction
    return (hit & positive & valid[None]).T


@dataclass
class CorefResult:
    anaphors: Anaphors
    heads: np.ndarray  # [A, K] bool
    baselines: np.ndarray  # [A, len(BASELINES)] bool
    n_layers: int
    n_heads: int
    n_no_pieces: int = 0  # anaphors whose head word has no pieces (attention counts them wrong)


def collect(items: Iterable[tuple[WordMaps, Record, int, str]], n_layers: int, n_heads: int) -> CorefResult:
    """Score every head and baseline over (word maps, record, words kept, split) documents."""
    an = Anaphors([], [], [], [], [], [], [])
    parts = []
    missing = 0
    for wm, record, n_words, split in items:
        idx = document_anaphors(record, n_words, split, an)
        if not idx:
            continue
        heads = [an.head[i] for i in idx]
        missing += int((word_block(wm, n_words).position[heads] < 0).sum())
        parts.append(attention_correct(wm, n_words, heads, [an.candidates[i] for i in idx], [an.right[i] for i in idx]))
    if not parts:
        raise ValueError("no mention with an antecedent in any document")
    return CorefResult(an, np.concatenate(parts), baseline_correct(an), n_layers, n_heads, missing)


def baseline_correct(an: Anaphors) -> np.ndarray:
    """[A, len(BASELINES)] whether each baseline's predicted head word is a right candidate."""
    return np.array(
        [
            [r[np.searchsorted(c, p)] if p in c else False for p in b]
            for c, r, b in zip(an.candidates, an.right, an.baselines)
        ],
        dtype=bool,
    ).reshape(len(an.candidates), len(BASELINES))


def _groups(res: CorefResult) -> list[tuple[str, str, np.ndarray]]:
    split = np.asarray(res.anaphors.split)
    kind = np.asarray(res.anaphors.kind)
    out = []
    for s in ["all"] + sorted(set(split)):
        ms = np.ones(len(split), dtype=bool) if s == "all" else split == s
        out.append((s, "all", ms))
        for t in TYPES:
            out.append((s, t, ms & (kind == t)))
    return out


def head_table(res: CorefResult, model: str) -> pd.DataFrame:
    """Tidy per-head accuracies: one row per (layer, head, split, anaphor type)."""
    layer, head = np.divmod(np.arange(res.n_layers * res.n_heads), res.n_heads)
    frames = []
    for s, t, m in _groups(res):
        n = int(m.sum())
        acc = res.heads[m].mean(0) if n else np.full(len(layer), np.nan)
        frames.append(
            pd.DataFrame({"model": model, "layer": layer, "head": head, "split": s, "type": t, "n": n, "accuracy": acc})
        )
    return pd.concat(frames, ignore_index=True)


def baseline_table(res: CorefResult, model: str) -> pd.DataFrame:
    rows = []
    for s, t, m in _groups(res):
        n = int(m.sum())
        for b, name in enumerate(BASELINES):
            rows.append(
                {
                    "model": model,
                    "system": name,
                    "split": s,
                    "type": t,
                    "n": n,
                    "accuracy": res.baselines[m, b].mean() if n else np.nan,
                }
            )
    return pd.DataFrame(rows)


def table2(res: CorefResult, model: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Clark's Table 2 analogue: baselines and the best head by anaphor type, beside the
    paper's numbers; CIs resample documents.

    Rows with ``scored_on`` "all" choose the head on all anaphors and score it there (as the
    paper). With two or more splits, rows with ``scored_on`` = the other splits choose the head
    on the first split only and score it, and the baselines, on the held-out anaphors.
    """
    kind = np.asarray(res.anaphors.kind)
    doc = np.asarray(res.anaphors.doc)
    split = np.asarray(res.anaphors.split)
    splits = list(dict.fromkeys(res.anaphors.split))
    plans = [("all", "all", np.ones(len(split), dtype=bool), np.ones(len(split), dtype=bool))]
    if len(splits) > 1:
        plans.append((splits[0], "+".join(splits[1:]), split == splits[0], split != splits[0]))
    rows = []
    for selected_on, scored_on, pick, score in plans:
        k = int(np.argmax(res.heads[pick].mean(0)))
        layer, head = divmod(k, res.n_heads)
        systems = [(name, res.baselines[:, b], "", -1, -1) for b, name in enumerate(BASELINES)]
        systems.append(("Best head", res.heads[:, k], head_label(layer, head), layer, head))
        for name, correct, label, lay, hd in systems:
            c, d, kd = correct[score], doc[score], kind[score]
            lo, hi = sentence_ci(c, d, n_boot, seed)
            row = {
                "model": model, "system": name, "scored_on": scored_on, "selected_on": selected_on if name == "Best head" else "",
                "label": label, "layer": lay, "head": hd, "n": len(c), "all": c.mean(), "ci_low": lo, "ci_high": hi,
            }  # fmt: skip
            for t in TYPES:
                m = kd == t
                row[f"n_{t}"] = int(m.sum())
                row[t] = c[m].mean() if m.any() else np.nan
            rows.append(row)
    t = pd.DataFrame(rows)
    paper = PAPER_TABLE2.assign(scored_on="all")
    t = t.merge(paper, on=["system", "scored_on"], how="outer")
    t["model"] = model
    t["layer"] = t["layer"].astype("Int64")
    t["head"] = t["head"].astype("Int64")
    order = {s: i for i, s in enumerate(PAPER_TABLE2["system"])}
    t["_order"] = (t["scored_on"] != "all") * 100 + t["system"].map(order)
    return t.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def anaphor_table(res: CorefResult, t2: pd.DataFrame, model: str) -> pd.DataFrame:
    """One row per anaphor: its candidates, every baseline's and the best head's correctness
    (the best head on all anaphors, from ``t2``)."""
    best = t2[(t2["system"] == "Best head") & (t2["scored_on"] == "all")].iloc[0]
    k = int(best["layer"]) * res.n_heads + int(best["head"])
    an = res.anaphors
    out = pd.DataFrame(
        {
            "model": model,
            "doc": an.doc,
            "split": an.split,
            "type": an.kind,
            "head": an.head,
            "n_candidates": [len(c) for c in an.candidates],
        }
    )
    for b, name in enumerate(BASELINES):
        out[name] = res.baselines[:, b]
    out["best_head"] = res.heads[:, k]
    return out


def coref_tables(res: CorefResult, model: str, *, n_boot: int = 1000, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every table of rule clark_syntax_coref from scored anaphors: heads, baselines, anaphors, table2."""
    t2 = table2(res, model, n_boot, seed)
    return {
        "heads": head_table(res, model),
        "baselines": baseline_table(res, model),
        "anaphors": anaphor_table(res, t2, model),
        "table2": t2,
    }


@dataclass(frozen=True, kw_only=True)
class CorefSettings(Settings):
    """The keys of analysis.clark_syntax (workflow/schemas/clark_syntax.schema.yaml) rule clark_syntax_coref reads."""

    SECTION = "analysis.clark_syntax"

    word_mode: str = "mean"
    bootstrap: int = 1000
    seed: int = 0
