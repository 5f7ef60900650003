"""The detectors by name: one entry each says where a query's target key is, how its score is divided, which
input kind it is read on, and how the figure and the atlas name it. The reducer, the analysis, the figure, the
atlas columns and circuits read this table; a new detector is one entry here (docs/detectors.md has a line per
entry).

A target function takes a :class:`Targets` of one batch and returns [B, n] key positions (-1: the query has
no target). ``every_query``: the score is divided by the sequence length n (every query counts, as for
Clark's previous-token statistic and Gu et al.'s alpha_1), else by the number of queries with a target.
``shared_target``: the layer view's name of the target, shared with other reducers where they ask for the
same keys (``offset:-1``, ``key:0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.data import SPECIAL_NONE


@dataclass(frozen=True)
class Targets:
    """What the target functions of one batch share: valid query positions, the other occurrence of each
    content token (:func:`headatlas.detectors.reducers.other_occurrence`), the special-token kinds."""

    lengths: np.ndarray  # [B]
    special: np.ndarray  # [B, n]
    dup: np.ndarray  # [B, n] other occurrence, -1 none

    @property
    def idx(self) -> np.ndarray:
        return np.arange(self.dup.shape[1])

    @property
    def valid(self) -> np.ndarray:
        return self.idx[None, :] < self.lengths[:, None]


@dataclass(frozen=True)
class Detector:
    name: str
    target: Callable[[Targets], np.ndarray]
    every_query: bool
    main_input: str  # "natural" or "repeated" (detectors.sequences.INPUT_KINDS)
    title: str  # the figure's panel
    describe: str  # the atlas column det_<name>
    shared_target: str = ""  # the layer view's target name when other reducers share it; default "detectors:<name>"

    @property
    def target_name(self) -> str:
        return self.shared_target or f"detectors:{self.name}"


def _prev(t: Targets) -> np.ndarray:
    return np.where(t.valid & (t.idx[None, :] >= 1), t.idx[None, :] - 1, -1)


def _duplicate(t: Targets) -> np.ndarray:
    return t.dup


def _induction(t: Targets) -> np.ndarray:
    """The token right after the other occurrence: a content token, not the query itself."""
    nxt = t.dup + 1
    ok = (t.dup >= 0) & (nxt < t.lengths[:, None]) & (nxt != t.idx[None, :])
    ok[ok] &= t.special[np.nonzero(ok)[0], nxt[ok]] == SPECIAL_NONE
    return np.where(ok, nxt, -1)


def _sink(t: Targets) -> np.ndarray:
    return np.where(t.valid, 0, -1)


REGISTRY: dict[str, Detector] = {
    d.name: d
    for d in (
        Detector(
            "prev", _prev, True, "natural", "previous token (natural text)",
            "previous-token score: mean attention to the previous token (natural text)", "offset:-1",
        ),
        Detector(
            "duplicate", _duplicate, False, "repeated", "duplicate token (repeated random)",
            "duplicate-token score: attention to the other occurrence of the query's token (repeated random tokens)",
        ),
        Detector(
            "induction", _induction, False, "repeated", "induction (repeated random)",
            "induction score: attention to the token after the earlier occurrence (repeated random tokens)",
        ),
        Detector(
            "sink", _sink, True, "natural", "first-token sink alpha_1 (natural text)",
            "sink score: mean attention to the first token, every query (Gu et al.'s alpha_1)", "key:0",
        ),
    )
}  # fmt: skip


def column(name: str) -> int:
    """The index of detector ``name`` on the reducer's last axis (the registry's order)."""
    return list(REGISTRY).index(name)
