"""Checks of the workflow's inputs before any job runs: config files, corpus map settings and model files.

- :func:`check_yaml`: a config file's YAML syntax errors and duplicate keys, as ``file:line:column``
  (Snakemake's own message for a bad ``--configfile`` names neither).
- :func:`merge_config` / :func:`config_bases`: a config's ``extends:`` key (configs merged under it).
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

MAP_MODES = ("full", "sample", "none")  # what an extraction keeps of the n x n maps (README: Fused reduction)
DEFAULT_SAMPLE = 32  # sequences whose maps a `maps: sample` corpus keeps


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and line, or the key."""


def map_setting(spec: dict, where: str = "corpus") -> tuple[str, int]:
    """(mode, K) of a corpus's config entry: ``maps: full | sample | none`` (``true`` / ``false`` as before:
    full / none) and ``sample: K`` (default :data:`DEFAULT_SAMPLE`, with ``maps: sample`` only; K = 0 else)."""
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
            below = merge_config(config_bases([base], chain), check_yaml(base))
            below.pop("extends", None)
            merged = merge_config(merged, below)
    return merged


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
    if kind == "gguf" and spec.source.get("assemble"):
        return []  # the package's assemble() writes the GGUF in rule cache_model (check_installed checks the package)
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
