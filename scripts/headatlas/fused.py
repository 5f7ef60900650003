"""Fused reduction plans: which reducers every analysis needs on a (model, corpus).

A corpus whose maps are not all stored (``maps: sample`` or ``none``, :func:`headatlas.core.inputs.map_setting`) is reduced
*fused*: its extraction job runs, during the forward pass, every reducer of every active analysis covering
that (model, corpus) and writes their results next to the store (:func:`headatlas.core.reduce.save_reduced`).
Each analysis declares its reducers in its own package by a function ``fused_plan(section, corpus)``
(section = its validated config section); :data:`PLANS` maps the analysis key to it. The workflow passes
the reducers' :meth:`~headatlas.core.reduce.Reducer.spec` (class and params) to the extraction rule through
``params:``, so changing a reducer setting reruns that corpus's extraction and nothing else.

This module imports the paper packages (it is the one place that joins them for extraction); ``core``
still imports no paper.
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from .core.reduce import Reducer, reducer_from_spec

# analysis key -> "module:function" of its plan (imported when used)
PLANS: dict[str, str] = {
    "clark_surface": "headatlas.clark.reducers:fused_plan",
    "pande": "headatlas.pande.reducers:fused_plan",
    "clark_syntax": "headatlas.clark.syntax_reducers:fused_plan",
    "position": "headatlas.core.position:fused_plan",
}


def plan_function(key: str) -> Callable[[dict, str], list[Reducer]]:
    module, _, name = PLANS[key].partition(":")
    return getattr(importlib.import_module(module), name)


def corpus_reducers(sections: dict[str, dict], corpus: str) -> list[Reducer]:
    """The reducers of every analysis in ``sections`` (key -> validated section of an active analysis that
    covers the model) on ``corpus``, in :data:`PLANS` order; names must be unique."""
    out: list[Reducer] = []
    for key in PLANS:
        if key not in sections:
            continue
        for r in plan_function(key)(sections[key], corpus):
            r.analysis = key
            out.append(r)
    names = [r.name for r in out]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"fused reducers on corpus {corpus}: names {dups} used twice (one file each)")
    return out


def reducer_specs(sections: dict[str, dict], corpus: str) -> list[dict]:
    """JSON-able :meth:`Reducer.spec` of :func:`corpus_reducers` (what the extraction rule's params carry)."""
    return [r.spec() for r in corpus_reducers(sections, corpus)]


def build_reducers(specs: list[dict]) -> list[Reducer]:
    """The reducers of :func:`reducer_specs`, rebuilt in the extraction job."""
    return [reducer_from_spec(s) for s in specs]


def sample_records(n_records: int, k: int, seed: int) -> np.ndarray:
    """The sorted record indices of a ``maps: sample`` corpus whose maps are kept: ``k`` of its
    ``n_records`` drawn with ``seed`` (the same in every shard, which keeps those in its slice)."""
    k = min(int(k), int(n_records))
    return np.sort(np.random.default_rng(seed).choice(int(n_records), size=k, replace=False)).astype(np.int64)
