"""Checks of the workflow's inputs before any job runs: config files, corpus map settings and model files.

- :func:`check_yaml`: a config file's YAML syntax errors and duplicate keys, as ``file:line:column``
  (Snakemake's own message for a bad ``--configfile`` names neither).
- :func:`merge_config` / :func:`config_bases` / :func:`extend_config`: a config's ``extends:`` key (configs merged
  under it) and its ``add_models:`` / ``add_corpora:`` keys (added to the base's).
- :func:`model_files`: the local files a model loads from (rule inputs: new weights re-extract);
  :func:`bos_warning`: a decoder that gets no BOS (its [CLS]/BOS columns would be empty).
- :func:`local_model_config`: a model's ``config.json`` when it is readable without a network (the position
  limit itself: :func:`headatlas.core.models.check_max_length`).
- :func:`map_setting`: a corpus's ``maps: full | sample | none`` (and ``sample: K``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import yaml

from .data import CorpusError, read_lines
from .models import ModelError, ModelSpec, architecture, gguf_file, model_kind, resolve

MAP_MODES = ("full", "sample", "none")  # what an extraction keeps of the n x n maps (docs/reduction.md)
DEFAULT_SAMPLE = 32  # sequences whose maps a `maps: sample` corpus keeps


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and line, or the key."""


def map_setting(spec: dict, where: str = "corpus") -> tuple[str, int]:
    """(mode, K) of a corpus's config entry: ``maps: full | sample | none`` (``true`` / ``false``
    are read as full / none) and ``sample: K`` (default :data:`DEFAULT_SAMPLE`, with ``maps: sample`` only; K = 0 else)."""
    maps = spec.get("maps", "full")
    mode = {True: "full", False: "none"}[maps] if isinstance(maps, bool) else maps
    if mode not in MAP_MODES:
        raise ConfigError(f"config key {where}.maps: {maps!r}; expected one of {list(MAP_MODES)} (or true / false)")
    if "sample" in spec and mode != "sample":
        raise ConfigError(f"config key {where}.sample: given with maps: {mode}; it applies to maps: sample only")
    k = int(spec.get("sample", DEFAULT_SAMPLE))
    if k < 1:
        raise ConfigError(f"config key {where}.sample: {k}; a sample needs at least one sequence")
    return mode, (k if mode == "sample" else 0)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if first != key_node.start_mark.line + 1:
                raise ConfigError(
                    f"{self.name}:{key_node.start_mark.line + 1}: key {key!r} given twice in one mapping (first on line {first})"
                )
        return super().construct_mapping(node, deep)


def check_yaml(path: str | Path) -> dict:
    """Load a YAML config file; a syntax error, a duplicate key or a top level that is not a
    mapping raises ConfigError naming ``file:line``. Files using YTE templates
    (``__use_yte__: true``) are checked for syntax only, JSON files not at all."""
    path = Path(path)
    try:
        text = "".join(read_lines(path))
    except CorpusError as e:
        raise ConfigError(str(e)) from None
    try:
        data = json.loads(text)  # Snakemake reads a JSON file as JSON first
    except ValueError:
        pass
    else:
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}:1: a config file is a mapping of keys (models:, corpora:, ...), not a {type(data).__name__}"
            )
        return data
    try:
        data = yaml.safe_load(text)
        if not (isinstance(data, dict) and data.get("__use_yte__")):
            loader = _StrictLoader(text)
            loader.name = str(path)
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = "; ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(f"{where}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML error: {e}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            f"{path}:1: a config file is a mapping of keys (models:, corpora:, ...), not a {type(data).__name__}"
        )
    return data or {}


def canonical(value):
    """``value`` with every dict's keys in sorted order (lists keep theirs): the same config in any key order gives
    the same rule params (Snakemake compares them as text and would rerun on a reordered dict)."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


# corpus keys that change its extraction, not its records: prepare_corpus leaves them out of its params
EXTRACTION_KEYS = ("shards", "overflow", "maps", "sample", "models", "reps")


def corpus_build_spec(spec: dict) -> dict:
    """What of a corpus entry changes its records (the params of prepare_corpus): without :data:`EXTRACTION_KEYS`,
    and without ``seed`` where only the map sample reads it (kinds other than wikitext)."""
    out = {k: v for k, v in spec.items() if k not in EXTRACTION_KEYS}
    if spec.get("kind") not in ("wikitext", "wikitext_long"):
        out.pop("seed", None)
    return canonical(out)


def merge_config(base: dict, over: dict) -> dict:
    """A new dict: ``over`` merged onto ``base``, mappings recursively, anything else (lists too)
    replaced, as Snakemake merges several ``--configfile`` files."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


# keys that add to the base config instead of replacing: key -> the key it adds to (config/README.md)
ADDITIONS = {"add_models": "models", "add_corpora": "corpora"}


def extend_config(base: dict, over: dict, where: str = "config") -> dict:
    """``over`` merged onto ``base`` (:func:`merge_config`), then its ``add_models`` entries appended to the models
    and its ``add_corpora`` entries added to the corpora. An added model also joins every ``models`` list of the
    base (a corpus's, an analysis's) that ``over`` does not restate, so it is extracted and analysed as the base's
    own models are. A name the config has already raises ConfigError naming ``where`` and the key."""
    out = merge_config(base, {k: v for k, v in over.items() if k not in ADDITIONS})
    added = over.get("add_models") or []
    if not isinstance(added, list) or not all(isinstance(m, dict) and "name" in m for m in added):
        raise ConfigError(f"{where}: config key add_models: a list of model entries (each with a name), not {added!r}")
    names = [m.get("name") for m in out.get("models", [])]
    clash = sorted({m["name"] for m in added} & set(names))
    if clash:
        raise ConfigError(
            f"{where}: config key add_models: {clash} already in models; change an entry under models: "
            "(restating the list) or give the new model another name"
        )
    if added:
        out["models"] = list(out.get("models", [])) + added
        new = [m["name"] for m in added]
        restated = over.get("corpora", {}), over.get("analysis", {})
        for group, mine in zip(("corpora", "analysis"), restated):
            out[group] = dict(out.get(group, {}))  # a copy: the base's mappings stay as they are
            for key, spec in out[group].items():
                own = (mine or {}).get(key)
                if isinstance(spec, dict) and spec.get("models") and not (isinstance(own, dict) and "models" in own):
                    out[group][key] = dict(spec, models=list(spec["models"]) + new)
    corpora = over.get("add_corpora") or {}
    if not isinstance(corpora, dict):
        raise ConfigError(f"{where}: config key add_corpora: a mapping of corpus name -> entry, not {corpora!r}")
    clash = sorted(set(corpora) & set(out.get("corpora", {})))
    if clash:
        raise ConfigError(
            f"{where}: config key add_corpora: {clash} already in corpora; change it under corpora: "
            "or give the new corpus another name"
        )
    if corpora:
        out["corpora"] = {**out.get("corpora", {}), **corpora}
    return out


def config_bases(paths, _chain: tuple[Path, ...] = ()) -> dict:
    """The configs that the ``extends:`` keys of ``paths`` name, merged in order (each file's own
    bases under it), without the files themselves; {} when none extends anything.

    ``extends:`` is a path or a list of paths, relative to the file that names it. A missing
    file or a cycle raises ConfigError naming the file and the key.
    """
    merged: dict = {}
    for path in paths:
        path = Path(path)
        data = check_yaml(path)
        names = data.get("extends") or []
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: config key extends: a path or a list of paths, not {names!r}")
        for name in names:
            base = (path.parent / name).resolve()
            if base in _chain or base == path.resolve():
                raise ConfigError(f"{path}: config key extends: {name!r} extends itself (a cycle)")
            if not base.is_file():
                raise ConfigError(f"{path}: config key extends: no such file {base}")
            chain = _chain + (path.resolve(),)
            below = extend_config(config_bases([base], chain), check_yaml(base), str(base))
            below.pop("extends", None)
            merged = merge_config(merged, below)
    return merged


def config_chain(paths) -> list[str]:
    """The config files ``paths`` and every config their ``extends:`` keys name (recursively), resolved, each once,
    in order (a missing or unreadable base is left to :func:`config_bases` to report)."""
    out: list[str] = []
    todo = [Path(p) for p in paths]
    while todo:
        path = todo.pop(0).resolve()
        if str(path) in out or not path.is_file():
            continue
        out.append(str(path))
        try:
            names = check_yaml(path).get("extends") or []
        except ConfigError:
            continue
        todo += [path.parent / n for n in ([names] if isinstance(names, str) else names) if isinstance(n, str)]
    return out


def _sets_something(path: str) -> bool:
    """Whether a config file sets anything but ``extends:`` and the keys that add (:data:`ADDITIONS`)."""
    try:
        return bool(set(check_yaml(path)) - {"extends", *ADDITIONS})
    except ConfigError:
        return False


def other_run_warning(record: str | Path, chain: list[str], cwd: str | Path = ".") -> str | None:
    """A warning when results/ holds a run of a config (``record``: the config files of the last finished run,
    written by the workflow) with settings that this run's configs (``chain``, :func:`config_chain`) leave out:
    a file of that run that sets more than ``extends:`` / ``add_*:`` and that this config does not extend (unless
    this config is part of that run's, e.g. the quick run after a recipe that extends it). Where the two differ,
    this config's corpora and settings replace that run's, so those jobs rerun."""
    try:
        last = json.loads(Path(record).read_text(encoding="utf-8"))["configs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not last or set(chain) <= set(last):
        return None
    lost = [p for p in last if p not in chain and _sets_something(p)]
    if not lost:
        return None
    cwd = Path(cwd).resolve()

    def show(p: str) -> str:
        return str(Path(p).relative_to(cwd)) if Path(p).is_relative_to(cwd) else p

    return (
        f"results/ holds the run of {show(last[0])}; {show(chain[0])} does not extend {show(lost[0])}: where "
        f"their corpora or settings differ, that run's outputs are rebuilt with this config's (to add to that run, "
        f"extend {show(last[0])}: README, Add a model)"
    )


# the files from_pretrained reads from a save_pretrained directory: config, weights, tokenizer
MODEL_FILE_PATTERNS = (
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.bin.index.json",
    "tokenizer*",
    "vocab.*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "*.model",
)


def model_files(spec: ModelSpec) -> list[str]:
    """The local files a model is loaded from, sorted: for a ``path`` or ``package`` source its
    config, weights and tokenizer files; for a ``gguf`` source the GGUF file; [] for a hub id, an assembled GGUF and
    for derived models (their directory is another rule's output). A missing directory, package,
    config.json or GGUF file raises ModelError naming the path and the config key."""
    kind = spec.source_kind
    if kind == "gguf" and (spec.source.get("assemble") or "gguf_parts" in spec.source):
        return []  # rule cache_model joins the GGUF from its chunk packages (check_installed checks them)
    if kind == "gguf":
        return [str(gguf_file(spec))]
    if kind not in ("path", "package"):
        return []
    loc = Path(resolve(spec)[0])
    found = {p for pattern in MODEL_FILE_PATTERNS for p in loc.glob(pattern) if p.is_file()}
    return sorted(map(str, found))


def bos_warning(spec: ModelSpec, config: dict) -> str | None:
    """Why a decoder gets no BOS token (so its [CLS]/BOS columns, Clark's BOS sink and Pande's
    delimiter-on-BOS role, stay empty), or None (an encoder, or a decoder with a BOS).
    ``config`` is the model's config.json as a dict."""
    try:
        if model_kind(SimpleNamespace(**config), spec) != "decoder":
            return None
        arch = architecture(config.get("model_type", ""), spec.name)
    except ModelError:
        return None
    if spec.bos_token == "none":
        why = "bos_token is 'none'"
    elif spec.bos_token == "auto" and not arch.bos:
        why = f"its model type {config.get('model_type')!r} is trained without a BOS (bos_token 'auto' adds none)"
    else:
        return None
    return (
        f"model {spec.name!r} is a decoder without a BOS token: {why}, so every [CLS]/BOS column (Clark's "
        f"attention to [CLS]/BOS, Pande's delimiter role on BOS) will be empty for it; set config key "
        f"models[{spec.name}].bos_token to a token string (e.g. '<|endoftext|>') to prepend one"
    )


def local_model_config(spec: ModelSpec) -> tuple[dict, str] | None:
    """(config.json as a dict, its path) when it is readable without a network: a ``path`` or
    ``package`` source, or a hub id already in the Hugging Face cache; else None."""
    kind = spec.source_kind
    if kind in ("path", "package"):
        try:
            loc, _ = resolve(spec)
        except ModelError:
            return None  # the extraction job reports it
        path = Path(loc) / "config.json"
    elif kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(spec.source["hub"], "config.json", revision=spec.source.get("revision"))
        except Exception:  # noqa: BLE001 - no cache, no package: nothing to check
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    else:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")), str(path)
    except (OSError, ValueError):
        return None


# the weight files one of which a hub repository holds (single file or sharded index)
HUB_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def uncached_hub_warning(specs: list[ModelSpec]) -> str | None:
    """One warning naming every hub-id model whose config.json or weights are not in the local Hugging Face
    cache (a lookup on disk, never the network); None when all are cached or there is no hub model."""
    hub = [s for s in specs if s.source_kind == "hub"]
    if not hub:
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    def cached(spec: ModelSpec, filename: str) -> bool:
        try:
            found = try_to_load_from_cache(spec.source["hub"], filename, revision=spec.source.get("revision"))
        except Exception:  # noqa: BLE001 - an unreadable cache holds nothing usable
            return False
        return isinstance(found, str)

    missing = [s for s in hub if not (cached(s, "config.json") and any(cached(s, f) for f in HUB_WEIGHTS))]
    if not missing:
        return None
    names = ", ".join(f"{s.name} ({s.source['hub']})" for s in missing)
    return (
        f"{len(missing)} of {len(hub)} hub models are not in the local Hugging Face cache ({constants.HF_HUB_CACHE}): "
        f"{names}. Their first jobs download them, which needs a network; offline, download them elsewhere and "
        "set source: {path: DIR} (docs/models.md)."
    )


def next_steps(configfiles: list, atlas_page: str | Path, cwd: str | Path = ".") -> list[str]:
    """The lines that end a successful run: how to build its report (with the run's --configfile) and where
    the atlas page is (when the run wrote one)."""
    cwd = Path(cwd).resolve()
    args = ""
    for f in configfiles:
        p = Path(f).resolve()
        args += f" --configfile {p.relative_to(cwd) if p.is_relative_to(cwd) else p}"
    snakemake = ".venv/bin/snakemake" if (cwd / ".venv/bin/snakemake").exists() else "snakemake"
    lines = [f"report:     {snakemake}{args} --report results/report.html   (then open it in a browser)"]
    if Path(atlas_page).is_file():
        lines.append(f"atlas page: {atlas_page}   (open it in a browser, from disk)")
    return lines
