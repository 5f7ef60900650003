"""Fused reduction plans: which reducers every analysis needs on a (model, corpus).

A corpus whose maps are not all stored (``maps: sample`` or ``none``, :func:`headatlas.core.inputs.map_setting`) is reduced
*fused*: its extraction job runs, during the forward pass, every reducer of every active analysis covering
that (model, corpus) and writes their results next to the store (:func:`headatlas.core.reduce.save_reduced`).
Each analysis declares its reducers in its own package by a function ``fused_plan(section, corpus)``
(section = its validated config section); :data:`PLANS` maps the analysis key to it. The workflow passes
the reducers' :meth:`~headatlas.core.reduce.Reducer.spec` (class and params) to the extraction rule through
``params:``, so changing a reducer setting reruns that corpus's extraction and nothing else.

This module imports the paper packages (it is the one place that joins them for extraction); ``core``
still imports no paper. :func:`extract_shard` is one store's extraction given the loaded model, fused or not:
the body of the extraction rules (one job per model x corpus x shard, or per model with ``extraction.jobs: model``).
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .core.data import Counts, Record, load_records
from .core.extract import ExtractSettings, config_hash, extract, shard_slice
from .core.models import ModelSpec, check_max_length
from .core.parse import trees_of
from .core.reduce import Reducer, reducer_from_spec

log = logging.getLogger("headatlas.fused")

# analysis key -> "module:function" of its plan (imported when used)
PLANS: dict[str, str] = {
    "clark_surface": "headatlas.clark.reducers:fused_plan",
    "pande": "headatlas.pande.reducers:fused_plan",
    "clark_syntax": "headatlas.clark.syntax_reducers:fused_plan",
    "position": "headatlas.position.reducers:fused_plan",
}


# registered reducer name (the class's ``name``) -> "module:Class": what an extraction's params name a reducer by
REDUCERS: dict[str, str] = {
    "clark_surface": "headatlas.clark.reducers:SurfaceReducer",
    "clark_js": "headatlas.clark.reducers:JSReducer",
    "pande_sieves": "headatlas.pande.reducers:SieveReducer",
    "clark_syntax_heads": "headatlas.clark.syntax_reducers:HeadPredictionReducer",
    "clark_syntax_coref": "headatlas.clark.syntax_reducers:CorefReducer",
    "clark_syntax_word_maps": "headatlas.clark.syntax_reducers:WordMapsReducer",
    "position": "headatlas.position.reducers:PositionReducer",
    "detectors": "headatlas.detectors.reducers:DetectorReducer",
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
            if REDUCERS.get(type(r).name) != f"{type(r).__module__}:{type(r).__qualname__}":
                raise ValueError(
                    f"reducer class {type(r).__qualname__}: register its name {type(r).name!r} in fused.REDUCERS"
                )
            if r.analysis != key:
                raise ValueError(
                    f"reducer class {type(r).__qualname__} serves analysis {r.analysis!r}, not {key!r}: set its class attribute analysis"
                )
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
    return [reducer_from_spec(s, REDUCERS) for s in specs]


def sample_records(n_records: int, k: int, seed: int) -> np.ndarray:
    """The sorted record indices of a ``maps: sample`` corpus whose maps are kept: ``k`` of its
    ``n_records`` drawn with ``seed`` (the same in every shard, which keeps those in its slice)."""
    k = min(int(k), int(n_records))
    return np.sort(np.random.default_rng(seed).choice(int(n_records), size=k, replace=False)).astype(np.int64)


def extraction_spec(params: dict, config) -> ModelSpec:
    """The model spec of one extraction's ``params`` (the workflow's ``extraction_params``), its
    max_length checked against the loaded model's ``config`` (a corpus may set it)."""
    spec = ModelSpec.from_config(params["model"])
    check_max_length(
        spec, config.to_dict(), f"{spec.name}'s config", params["reps"] and params["rep_position"] == "past_last"
    )
    return spec


def extract_shard(
    records: Sequence[Record],
    params: dict,
    corpus: str,
    shard: int,
    n_shards: int,
    out_dir: str | Path,
    model,
    tokenizer,
    config,
    trees: Sequence[str | Path] = (),
) -> Counts:
    """Extract shard ``shard`` of ``n_shards`` of ``records`` (the whole corpus ``corpus``) with the loaded
    ``model`` into the store ``out_dir`` (written atomically), as ``params`` say (the workflow's
    ``extraction_params``: model settings, maps, reps, and for a fused corpus its reducers' specs and sample).
    ``trees``: the parse (at most one file) the fused reducers read their trees from; default the corpus's own."""
    spec = extraction_spec(params, config)
    part = shard_slice(len(records), shard, n_shards)
    log.info(
        "model %s on %s, corpus %s shard %d/%d: records %d..%d",
        spec.name, model.device, corpus, shard, n_shards, part.start, part.stop,
    )  # fmt: skip
    meta = {"corpus": corpus, "shard": shard, "n_shards": n_shards, "config_hash": config_hash(params)}
    # a fused corpus (maps: sample or none): the reducers of every analysis covering it, and the sample's records
    fused = params.get("fused")
    reducers = sample = None
    corpus_records = list(records)  # the whole corpus: a shard whose every record is too long checks the others
    if fused:
        reducers = build_reducers(fused["reducers"])
        if fused["sample"]:
            sample = sample_records(len(records), fused["sample"], fused["seed"])
        trees = list(trees)
        corpus_records = trees_of(list(records), load_records(trees[0]) if trees else None)
        log.info(
            "fused: reducers %s; maps kept for %s",
            [f"{r.analysis}/{r.name}" for r in reducers],
            f"{len(sample)} sampled records of the corpus" if sample is not None else "no sequence",
        )
    settings = ExtractSettings(
        storage_dtype=params["storage_dtype"],
        overflow=params["overflow"],
        maps=params["maps"],
        reps=params["reps"],
        rep_position=params["rep_position"],
        attention=fused.get("attention", "auto") if fused else "auto",
        cpu_pass=fused.get("cpu_pass", "auto") if fused else "auto",
    )
    counts = extract(
        records[part],
        spec,
        model,
        tokenizer,
        config,
        out_dir,
        settings,
        part.start,
        meta,
        reducers,
        sample,
        corpus_records,
    )
    log.info("corpus %s shard %d/%d: counts %s", corpus, shard, n_shards, counts.values)
    return counts
