"""Sieve bias scores of Pande et al. 2021, "The Heads Hypothesis" (shared methods §1.2-1.3).

A *sieve* S_i is the set of keys a query token i "should" attend to under a role. The sieve
bias of query i is its mean attention over the sieve divided by the uniform share:

    b_i = mean_{j in S_i} A_ij / (sum_j A_ij / k_i)

where k_i is the number of keys row i may attend to (n for encoders, i + 1 under a causal
mask; the sieve is cut to those keys). Uniform attention scores exactly 1. A sentence's score
is the mean of b_i over the query tokens whose sieve is not empty; for syntactic roles it is
the mean over the sentence's dependency pairs of the relation, a pair's score being the mean
of b_a over the dependent's pieces a with the head word's pieces as sieve (direction
dependent -> head by default).

Roles:
- ``local``: offsets -window..+window around i, i itself included;
- ``delimiter``: [CLS] (decoders: BOS) and every [SEP]; ``delimiter_cls`` and
  ``delimiter_sep`` keep one kind;
- ``block`` (pair inputs only): the content tokens of the query's own segment; a special
  token takes the segment of the next content token ([CLS] -> A, [SEP]1 and [SEP]2 -> B, as
  in the reference code). With ``block_entropy`` (default, as the reference code) b_i is
  multiplied by the Shannon entropy (nats) of row i, so uniform attention scores ln k_i;
- ``syntactic`` (the union of the configured relations) and ``syntactic_<rel>`` per relation.

The roles themselves (their sieves, order and notes) are the registry :data:`headatlas.pande.roles.ROLES`.
This module holds the settings, the dependency pairs and the notes; the scores are computed
by :class:`headatlas.pande.reducers.SieveReducer` (tested against the numpy reference in
tests/reference/sieves.py). The local window is :func:`headatlas.core.patterns.local_band`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..core.data import SPECIAL_NONE
from ..core.settings import Settings
from .roles import ROLES, Role, arc_role

DIRECTIONS = ("dep_to_head", "head_to_dep", "both")


@dataclass(frozen=True, kw_only=True)
class SieveSettings(Settings):
    """The sieve keys of analysis.pande (workflow/schemas/pande.schema.yaml) rule pande_scores reads."""

    SECTION = "analysis.pande"
    RENAME = {"local_window": "window", "relation_labels": "labels"}  # config key -> field
    CONVERT = {"labels": lambda v: {rel: tuple(labs) for rel, labs in v.items()}}

    window: int = 2
    relations: tuple[str, ...] = ("nsubj", "obj", "amod", "advmod")
    # relation -> dependency labels that count as it (spaCy's English parser says dobj, UD says obj)
    labels: dict = field(default_factory=lambda: {"obj": ("obj", "dobj")})
    direction: str = "dep_to_head"
    block_entropy: bool = True

    def __post_init__(self):
        if self.window < 0:
            raise ValueError(f"local window must be >= 0, not {self.window}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {self.direction!r}")
        if len(set(self.relations)) != len(self.relations):
            raise ValueError(f"relations listed twice: {self.relations}")

    def label_map(self) -> dict[str, int]:
        """Dependency label -> index of the relation it counts for."""
        out: dict[str, int] = {}
        for r, rel in enumerate(self.relations):
            for lab in self.labels.get(rel, (rel,)):
                if lab in out:
                    raise ValueError(f"dependency label {lab!r} counts for two relations")
                out[lab] = r
        return out


def dependency_pairs(
    head, deprel, settings: SieveSettings, n_words: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dependent word, head word, relation index) of every pair of a configured relation
    whose two words are both kept (``n_words``: words present in the model input)."""
    if not len(head):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    labels = settings.label_map()
    rel = np.array([labels.get(d, -1) for d in deprel], dtype=np.int64)
    head = np.asarray(head, dtype=np.int64)
    dep = np.arange(len(head))
    n = len(head) if n_words is None else n_words
    keep = (rel >= 0) & (head >= 0) & (dep < n) & (head < n)
    return dep[keep], head[keep], rel[keep]


def query_segment(special: np.ndarray, segment: np.ndarray, seq_start: np.ndarray | None = None) -> np.ndarray:
    """Segment of each token as a block query: its own for content tokens; a special token
    takes the segment of the next content token of its sequence (the last one's when none
    follows). ``seq_start``: first token of each sequence when several are concatenated."""
    special = np.asarray(special)
    segment = np.asarray(segment)
    t = len(special)
    starts = np.array([0]) if seq_start is None else np.asarray(seq_start)
    seq = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, t)))
    content = special == SPECIAL_NONE
    pos = np.arange(t)
    big = t + 1
    # reversed running minimum of (sequence, position of a content token): stays in the sequence
    key = seq * big + np.where(content, pos, t)
    nxt = np.minimum.accumulate(key[::-1])[::-1] - seq * big
    last = np.maximum.reduceat(np.where(content, pos, -1), starts)[seq] if t else pos
    src = np.where(nxt < t, nxt, np.where(last >= 0, last, pos))
    return segment[src]


def blas_threads(n: int):
    """Limit BLAS to ``n`` threads (threadpoolctl comes with scikit-learn); a no-op without it."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def role_notes(
    scores, roles, has_trees, pairs_present, settings: SieveSettings, corpus: str, model_kind: str,
    registry: dict[str, Role] = ROLES,
) -> dict:  # fmt: skip
    """role -> why it has no sentence in this corpus, for the roles without any (the registry's ``empty``
    note, the syntactic roles' reasons, or a generic one)."""
    notes = {}
    valid = ~np.isnan(scores[:, 0, 0, :])
    arcs = arc_role(registry)
    for r, role in enumerate(roles):
        if valid[:, r].any():
            continue
        if role == arcs or role.startswith(f"{arcs}_"):
            if not has_trees.any():
                why = f"corpus {corpus} has no dependency trees"
            else:
                rel = role[len(arcs) + 1 :] or "any configured relation"
                present = int(
                    pairs_present[settings.relations.index(rel)] if rel in settings.relations else pairs_present[-1]
                )
                labels = settings.labels.get(rel, (rel,)) if rel in settings.relations else settings.label_map().keys()
                if present:
                    why = (f"corpus {corpus}: none of the {present} pairs of relation {rel} is visible under the causal "
                           f"mask in direction {settings.direction}")  # fmt: skip
                else:
                    why = f"corpus {corpus}: no sentence has a pair of relation {rel} (labels {sorted(labels)})"
        elif role in registry and registry[role].empty:
            why = registry[role].empty.format(corpus=corpus, model_kind=model_kind)
        else:
            why = f"corpus {corpus}: no query token has a {role} sieve"
        notes[role] = why
    return notes
