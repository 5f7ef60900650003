"""The workflow's config, checked and resolved before any job is planned (``workflow/rules/common.smk`` calls these).

Functions of the validated config dict (after the schema filled its defaults) and of the files a check has to
look at (a model's directory, package or ``config.json``; a model directory a rule has written, under the
working directory's ``results/``). Every failure names the config key.

- :func:`check_config`: model and corpus names, and every cross-reference between models, corpora and analyses;
- :func:`resolve_models`: the model entries by name, a derived (fine-tuned, random-init) model with its base's
  settings; :func:`rule_model_dir`: the directory a rule writes a model to;
- :func:`model_corpora`, :func:`corpus_model`, :func:`helper_models`: who extracts what, with which settings;
- :func:`check_packages`, :func:`check_models`, :func:`check_corpus_lengths`: every model's files and package, and
  every ``max_length`` (a model's, or a long corpus's ``tokens``) against the position limit of the model's
  ``config.json`` where it is readable now (the others are checked when extraction loads them).
"""

from __future__ import annotations

import json
from pathlib import Path

from .inputs import bos_warning, local_model_config, model_files
from .integrity import check_name
from .models import ModelSpec, check_installed, check_max_length

DERIVED_SOURCES = ("finetuned", "random_init")  # sources that are another config model, changed by a rule
# source kind -> the directory under results/models/ its own rule writes the model to
RULE_DIRS = {"gguf": "gguf", "zip_parts": "assembled", "finetuned": "finetuned", "random_init": "random_init"}


def check_config(config: dict) -> None:
    """Model and corpus names are plain file-name parts, model names unique; every corpus a model, a corpus's
    ``models`` or an analysis names exists (its ``corpora``, ``long_corpora``, ``long.corpora``); no corpus is in
    both an analysis's ``corpora`` and its ``long_corpora``."""
    names = [check_name(m["name"], "models[].name") for m in config["models"]]
    for corpus in config["corpora"]:
        check_name(corpus, "corpora")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"config key models: duplicate model names {dups}")
    for m in config["models"]:
        for corpus in m.get("corpora", []):
            if corpus not in config["corpora"]:
                raise ValueError(
                    f"config key models[{m['name']}].corpora: unknown corpus {corpus!r}; "
                    f"known: {sorted(config['corpora'])}"
                )
    for corpus, spec in config["corpora"].items():
        unknown = sorted(set(spec.get("models", [])) - set(names))
        if unknown:
            raise ValueError(f"config key corpora.{corpus}.models: unknown models {unknown}; known: {sorted(names)}")
    for key, spec in config["analysis"].items():
        lists = {"corpora": spec.get("corpora", []), "long_corpora": spec.get("long_corpora", [])}
        if isinstance(spec.get("long"), dict):  # analysis.detectors.long
            lists["long.corpora"] = spec["long"].get("corpora", [])
        for name, corpora in lists.items():
            for corpus in corpora:
                if corpus not in config["corpora"]:
                    raise ValueError(
                        f"config key analysis.{key}.{name}: unknown corpus {corpus!r}; known: {sorted(config['corpora'])}"
                    )
        both = sorted(set(lists["corpora"]) & set(lists["long_corpora"]))
        if both:
            raise ValueError(
                f"config key analysis.{key}.long_corpora: {both} also in analysis.{key}.corpora; a corpus gets every "
                "part of the analysis (corpora) or the per-head statistics only (long_corpora), not both"
            )


def derived_kind(entry: dict) -> str | None:
    """``finetuned`` or ``random_init`` for a derived model entry, else None."""
    return next((k for k in DERIVED_SOURCES if k in entry["source"]), None)


def resolve_models(config: dict) -> dict[str, dict]:
    """Model entries by name; a derived (fine-tuned, random-init) model inherits every setting of its base that it
    does not set itself (not its name, source or corpora). Its base must be a non-derived model of the config, its
    fine-tuning task a key of ``finetune_tasks``."""
    entries = config["models"]
    models = {m["name"]: dict(m) for m in entries}
    for name, m in models.items():
        kind = derived_kind(m)
        if kind is None:
            continue
        ft = m["source"][kind]
        base = models.get(ft["base"])
        if base is None or derived_kind(base):
            raise ValueError(
                f"config key models[{name}].source.{kind}.base: {ft['base']!r} is not a (non-derived) model of this config"
            )
        if kind == "finetuned" and ft["task"] not in config.get("finetune_tasks", {}):
            raise ValueError(
                f"config key models[{name}].source.finetuned.task: {ft['task']!r} is not a key of finetune_tasks"
            )
        user = set(entries[[e["name"] for e in entries].index(name)])
        for key, value in base.items():
            if key not in user and key not in ("name", "source", "corpora"):
                m[key] = value
    return models


def loaded_from(models: dict[str, dict], name: str) -> dict:
    """The entry whose files a model is made from: its base's for a derived model, else its own."""
    m = models[name]
    kind = derived_kind(m)
    return models[m["source"][kind]["base"]] if kind else m


def rule_model_dir(name: str, source: dict) -> str | None:
    """The directory a workflow rule writes model ``name`` to (GGUF, zip parts, fine-tuned, random-init), else
    None (a hub, path or package model is loaded from where it is)."""
    kind = next((k for k in RULE_DIRS if k in source), None)
    return f"results/models/{RULE_DIRS[kind]}/{name}" if kind else None


def model_corpora(config: dict, models: dict[str, dict], name: str) -> list[str]:
    """The corpora extracted for a model: its own ``corpora`` list, or all; without the corpora whose own
    ``models`` list leaves it out."""
    corpora = config["corpora"]
    return [c for c in models[name].get("corpora", list(corpora)) if name in corpora[c].get("models", [name])]


def corpus_model(config: dict, models: dict[str, dict], name: str, corpus: str) -> dict:
    """The model's settings on one corpus: a corpus with ``tokens`` (wikitext_long) sets max_length."""
    tokens = config["corpora"][corpus].get("tokens")
    if tokens is None:
        return models[name]
    return dict(models[name], max_length=tokens, length_corpus=corpus)


def helper_models(models: dict[str, dict]) -> set[str]:
    """Models with their own ``corpora`` list: baselines that get no analysis targets of their own."""
    return {m for m, spec in models.items() if "corpora" in spec}


def check_packages(models: dict[str, dict]) -> None:
    """A model whose source package is missing (and whose directory no rule has written yet) is an error with the
    command that installs it (the source's ``pip``)."""
    for name, m in models.items():
        if "gguf" in m["source"] or "zip_parts" in m["source"]:
            if Path(rule_model_dir(name, m["source"])).is_dir():
                continue
        check_installed(ModelSpec.from_config(m))


def check_models(config: dict, models: dict[str, dict]) -> list[str]:
    """Every local model directory, package and GGUF file exists (else an error naming its path); max_length against
    the position limit of every model whose config.json is readable now (a derived model against its base's).
    Returns the warnings for decoders that get no BOS."""
    past_last = config["extraction"]["rep_position"] == "past_last"
    warnings = []
    for name, m in models.items():
        base = ModelSpec.from_config(loaded_from(models, name))
        model_files(base)
        found = local_model_config(base)
        if found:
            check_max_length(ModelSpec.from_config(m), found[0], found[1], past_last)
            warning = bos_warning(ModelSpec.from_config(m), found[0])
            if warning:
                warnings.append(warning)
    return warnings


def check_corpus_lengths(config: dict, models: dict[str, dict]) -> None:
    """Every long corpus (``tokens``) against the position limit of every model that extracts it, where its
    config.json is readable now (a path or package model, or a model directory a rule has written already)."""
    past_last = config["extraction"]["rep_position"] == "past_last"
    for name, m in models.items():
        for corpus in model_corpora(config, models, name):
            if "tokens" not in config["corpora"][corpus]:
                continue
            found = local_model_config(ModelSpec.from_config(loaded_from(models, name)))
            written = rule_model_dir(name, m["source"])
            cached = Path(written or "", "config.json")
            if not found and written and cached.is_file():
                found = (json.loads(cached.read_text()), str(cached))
            if found:
                spec = ModelSpec.from_config(corpus_model(config, models, name, corpus))
                check_max_length(spec, found[0], found[1], past_last)
