"""The workflow's config, checked and resolved before any job is planned (``workflow/rules/common.smk`` calls these).

Functions of the validated config dict (after the schema filled its defaults) and of the files a check has to
look at (a model's directory, package or ``config.json``; a model directory a rule has written, under the
working directory's ``results/``). Every failure names the config key.

- :func:`schema_problem`: a schema error as one line naming the key path, with the nearest known key;
- :func:`check_config`: model and corpus names, and every cross-reference between models, corpora and analyses;
  :func:`check_section`: an analysis section's own (its defaults filled); :func:`check_input_paths`: every input
  file the config names exists (on every run); :func:`coverage_warnings`: models no analysis or no atlas covers;
- :func:`resolve_models`: the model entries by name, a derived (fine-tuned, random-init) model with its base's
  settings; :func:`rule_model_dir`: the directory a rule writes a model to;
- :func:`model_corpora`, :func:`corpus_model`, :func:`helper_models`: who extracts what, with which settings;
- :func:`check_packages`, :func:`check_models`, :func:`check_corpus_lengths`: every model's files and package, and
  every ``max_length`` (a model's, or a long corpus's ``tokens``) against the position limit of the model's
  ``config.json`` where it is readable now (the others are checked when extraction loads them);
  :func:`check_without_maps`: its ``maps: sample`` corpora against its model type's capabilities.
"""

from __future__ import annotations

import json
from pathlib import Path

from .inputs import bos_warning, local_model_config, map_setting, model_files
from .integrity import check_name
from .models import ARCHITECTURES, ModelError, ModelSpec, check_installed, check_max_length, without_maps

DERIVED_SOURCES = ("finetuned", "random_init")  # sources that are another config model, changed by a rule
# source kind -> the directory under results/models/ its own rule writes the model to
RULE_DIRS = {"gguf": "gguf", "zip_parts": "assembled", "finetuned": "finetuned", "random_init": "random_init"}


def check_config(config: dict) -> None:
    """Model and corpus names are plain file-name parts, model names unique; every corpus a model, a corpus's
    ``models`` or an analysis names as written exists (:func:`check_section` checks an active section again with
    its defaults); no corpus is in both an analysis's ``corpora`` and its ``long_corpora``."""
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
        for at, corpus in _corpus_refs(spec, f"analysis.{key}"):
            if corpus not in config["corpora"]:
                raise ValueError(f"config key {at}: unknown corpus {corpus!r}; known: {sorted(config['corpora'])}")
        lists = {"corpora": spec.get("corpora", []), "long_corpora": spec.get("long_corpora", [])}
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
    the position limit of every model whose config.json is readable now (a derived model against its base's), and
    its ``maps: sample`` corpora against its model type (:func:`check_without_maps`). Returns the warnings for
    decoders that get no BOS."""
    past_last = config["extraction"]["rep_position"] == "past_last"
    warnings = []
    for name, m in models.items():
        base = ModelSpec.from_config(loaded_from(models, name))
        model_files(base)
        found = local_model_config(base)
        if found:
            check_max_length(ModelSpec.from_config(m), found[0], found[1], past_last)
            check_without_maps(config, models, name, found[0].get("model_type", ""))
            warning = bos_warning(ModelSpec.from_config(m), found[0])
            if warning:
                warnings.append(warning)
    return warnings


def check_without_maps(config: dict, models: dict[str, dict], name: str, model_type: str) -> None:
    """A ``maps: sample`` corpus of the model is reduced while the model runs (as is a ``maps: none`` one that an
    analysis reduces, which its extraction checks); a model type whose row of
    :data:`~headatlas.core.models.ARCHITECTURES` allows that on no attention path (extraction's ``attention``) is
    an error naming the corpus's key."""
    arch = ARCHITECTURES.get(model_type)
    attention = config["extraction"].get("attention", "auto")  # the schema's default
    why = None if arch is None else without_maps(arch, attention)  # an unknown type fails at load
    for corpus in model_corpora(config, models, name) if why else ():
        if map_setting(config["corpora"][corpus], f"corpora.{corpus}")[0] == "sample":
            auto = attention != "auto" and without_maps(arch) is None
            raise ModelError(
                f"config key corpora.{corpus}.maps: sample on model {name!r} (model type {model_type!r}): its "
                f"attention cannot be reduced without stored maps: {why}; set maps: full for this corpus"
                + (" or extraction.attention: auto" if auto else "")
                + " (docs/models.md 'Supported model types')"
            )


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


# --- the schema's verdict, short --------------------------------------------------------------------------------
SCHEMA_DUMP_ENV = "HEADATLAS_SCHEMA_DUMP"  # set to 1: Snakemake's own message, with the whole schema and config


def _key_path(where: str, path, instance) -> str:
    """``models[bert].max_length`` for the jsonschema path ``models/0/max_length`` (a list item by its name)."""
    out, node = where, instance
    for part in path:
        if isinstance(part, int):
            name = node[part].get("name") if isinstance(node[part], dict) else None
            out += f"[{name if isinstance(name, str) else part}]"
        else:
            out += f".{part}" if out else str(part)
        node = node[part]
    return out


def schema_problem(data: dict, schema: dict, where: str = "") -> str | None:
    """The first thing ``data`` breaks in ``schema`` as one line naming its key path (``where`` is the path of
    ``data`` itself, e.g. ``analysis.pande``), with the nearest known key for an unknown one; None when valid."""
    import difflib

    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return None
    at = _key_path(where, error.absolute_path, data)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        extra = sorted(k for k in error.instance if k not in known)
        if extra:
            key = f"{at}.{extra[0]}" if at else str(extra[0])
            close = difflib.get_close_matches(str(extra[0]), list(known), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(sorted(known))}"
            return f"{key}: unknown key; {hint}"
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"{at or 'config'}: {message}"


# --- inputs and cross-references that must hold on every run ----------------------------------------------------
def _is_rule_output(path: str) -> bool:
    """A path under results/: another rule writes it (a generated corpus), so it need not exist before the run."""
    return Path(path).parts[:1] == ("results",)


def check_input_paths(config: dict) -> None:
    """Every input file the config names exists now (on every run, not only when its job is planned): each corpus's
    ``path`` / ``paths`` (except files another rule writes, under results/), each fine-tuning task's ``train`` and
    ``dev``, and Jo & Myaeng's downstream task files. A missing one is an error naming its key path."""
    named = []
    for corpus, spec in config["corpora"].items():
        if "path" in spec:
            named.append((f"corpora.{corpus}.path", spec["path"]))
        for i, p in enumerate(spec.get("paths", [])):
            named.append((f"corpora.{corpus}.paths[{i}]", p))
    for task, spec in config.get("finetune_tasks", {}).items():
        named += [(f"finetune_tasks.{task}.{k}", spec[k]) for k in ("train", "dev") if k in spec]
    jm = config["analysis"].get("jomyaeng") or {}
    if jm.get("activate", True):
        for task, spec in (jm.get("downstream") or {}).items():
            named += [
                (f"analysis.jomyaeng.downstream.{task}.{k}", spec[k]) for k in ("train", "dev", "test") if k in spec
            ]
    for key, path in named:
        if isinstance(path, str) and not _is_rule_output(path) and not Path(path).is_file():
            raise ValueError(f"config key {key}: no such file {path} (relative paths start at {Path.cwd()})")


def section_active(config: dict, key: str, given=None, on_when_absent=("atlas",)) -> bool:
    """An analysis runs when its section is present (the atlas also when absent) and ``activate`` is not false;
    ``given``: the sections the user wrote (default: those in the config now; the workflow fills absent ones)."""
    section = config["analysis"].get(key)
    if section is None or (given is not None and key not in given):
        return key in on_when_absent
    return bool(section.get("activate", True))


def _corpus_refs(section: dict, path: str):
    """(key path, corpus name) of every corpus an analysis section names: ``corpus`` / ``*_corpus`` /
    ``probe_train`` strings, ``corpora`` / ``*_corpora`` lists and ``*_corpora`` / ``probe_eval`` mappings."""
    for key, value in section.items():
        at = f"{path}.{key}"
        if key in ("corpus", "probe_train") or key.endswith("_corpus"):
            if isinstance(value, str):
                yield at, value
        elif key in ("corpora", "probe_eval") or key.endswith("_corpora"):
            items = value.items() if isinstance(value, dict) else enumerate(value or [])
            for k, v in items:
                if isinstance(v, str):
                    yield f"{at}.{k}" if isinstance(value, dict) else at, v
        elif isinstance(value, dict) and key != "downstream":
            yield from _corpus_refs(value, at)


def surface_corpus_default(config: dict, given: dict) -> dict:
    """The atlas section as given, with ``surface_corpus`` set to the first of ``analysis.clark_surface.corpora``
    when it is not given and the schema's default (wiki) is not one of them."""
    surface = (config["analysis"].get("clark_surface") or {}).get("corpora") or []
    if "surface_corpus" in given or not surface or "wiki" in surface:
        return given
    return dict(given, surface_corpus=surface[0])


def check_section(config: dict, key: str, section: dict, given: dict | None = None, sections=None) -> None:
    """The cross-references of one active analysis section (``section`` with its defaults, ``given`` as the user
    wrote it): every corpus it names is a corpus of the config (the atlas's as given: it runs when absent, and a
    page corpus the config lacks only leaves the page without examples), every model of its ``models`` list a
    model; the atlas's ``surface_corpus`` is one of Clark's surface corpora when that analysis runs (else the atlas
    would get no surface columns). ``sections``: the analysis sections the user wrote."""
    corpora = config["corpora"]
    refs = given if key == "atlas" and given is not None else section
    for at, corpus in _corpus_refs(refs, f"analysis.{key}"):
        if corpus not in corpora:
            raise ValueError(f"config key {at}: unknown corpus {corpus!r}; known: {sorted(corpora)}")
    names = [m["name"] for m in config["models"]]
    unknown = [m for m in section.get("models") or [] if m not in names]
    if unknown:
        raise ValueError(f"config key analysis.{key}.models: unknown models {unknown}; known: {sorted(names)}")
    if key == "atlas" and section_active(config, "clark_surface", sections):
        surface = (config["analysis"].get("clark_surface") or {}).get("corpora") or []
        if section["surface_corpus"] not in surface:
            raise ValueError(
                f"config key analysis.atlas.surface_corpus: {section['surface_corpus']!r} is not one of "
                f"analysis.clark_surface.corpora {surface}; the atlas's surface columns come from one of them"
            )


def coverage_warnings(config: dict, models: dict[str, dict]) -> list[str]:
    """One warning per model (not a helper) that no analysis covers, and per model the atlas leaves out, naming
    the ``models`` lists that leave it out."""
    helpers = helper_models(models)
    active = [k for k in config["analysis"] if section_active(config, k)]
    if "atlas" not in active and section_active(config, "atlas"):
        active.append("atlas")

    def covers(key: str, name: str) -> bool:
        listed = (config["analysis"].get(key) or {}).get("models") or []
        return not listed or name in listed

    out = []
    for name in models:
        if name in helpers:
            continue
        left_out = [f"analysis.{k}.models" for k in active if not covers(k, name)]
        others = [k for k in active if k != "atlas"]
        if others and not any(covers(k, name) for k in others):
            verb = "leaves" if len(left_out) == 1 else "leave"
            out.append(f"model {name!r} is in no analysis: {', '.join(left_out)} {verb} it out; add it there")
        elif "atlas" in active and not covers("atlas", name):
            out.append(f"model {name!r} is not in the atlas page and tables: analysis.atlas.models leaves it out")
    return out
