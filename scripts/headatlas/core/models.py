"""Model sources, loading and the GGUF dequantisation cache.

A model entry in the config names exactly one source:

- ``{hub: ID, revision: REV}``: a Hugging Face hub id (needs a network or a filled HF cache);
- ``{path: DIR}``: a local directory written by ``save_pretrained``;
- ``{package: NAME, path: SUBDIR}``: a model shipped inside an installed Python package;
- ``{gguf: FILE}`` or ``{gguf: FILE, package: NAME}``: a GGUF file, dequantised once to an
  fp32 directory by its own rule;
- ``{finetuned: {base: MODEL, task: TASK}}``: another config model fine-tuned on a bundled
  task by its own rule (a derived model: same inputs, same analyses);
- ``{random_init: {base: MODEL, seed: N}}``: another config model with every weight
  re-initialised (seeded) except its word and position embeddings, written by its own rule
  (Clark et al.'s random-init baseline).

Models are always loaded with eager attention, the only implementation that returns
attention probabilities.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ENCODER_TYPES = {"bert", "electra", "roberta", "distilbert", "albert", "xlm-roberta", "deberta", "deberta-v2"}
DECODER_TYPES = {"gpt2", "openai-gpt", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "gptj", "phi", "phi3", "gemma", "olmo", "opt"}


class ModelError(RuntimeError):
    """A model that cannot be found, loaded or used; the message names the model."""


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
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, entry: dict) -> "ModelSpec":
        known = {"name", "source", "dtype", "max_length", "batch_size", "device", "bos_token", "arch"}
        extra = {k: v for k, v in entry.items() if k not in known}
        return cls(**{k: v for k, v in entry.items() if k in known}, extra=extra)

    @property
    def source_kind(self) -> str:
        for kind in ("finetuned", "random_init", "gguf", "hub", "package", "path"):
            if kind in self.source:
                return kind
        raise ModelError(f"model {self.name!r}: unknown source {self.source!r}; use one of hub, path, package, gguf, finetuned, random_init")


def package_dir(package: str, model: str = "") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model {model!r}: package {package!r} is not installed; install it (see README) or change the model's source"
        )
    return Path(list(spec.submodule_search_locations)[0])


def gguf_file(spec: ModelSpec) -> Path:
    """The GGUF file of a ``gguf`` source."""
    src = spec.source
    path = Path(src["gguf"])
    if "package" in src:
        path = package_dir(src["package"], spec.name) / path
    if not path.is_file():
        raise ModelError(f"model {spec.name!r}: GGUF file {path} does not exist (config key models[{spec.name}].source.gguf)")
    return path


def resolve(spec: ModelSpec, cache_dir: str | Path | None = None) -> tuple[str, dict]:
    """Where ``from_pretrained`` should load the model from, and its extra arguments."""
    kind = spec.source_kind
    if kind == "hub":
        return spec.source["hub"], {"revision": spec.source.get("revision", "main")}
    if kind in ("gguf", "finetuned", "random_init"):
        if cache_dir is None:
            raise ModelError(f"model {spec.name!r}: a {kind} model is read from the directory its own rule writes; none was given")
        return str(cache_dir), {}
    if kind == "package":
        loc = package_dir(spec.source["package"], spec.name) / spec.source.get("path", "")
    else:
        loc = Path(spec.source["path"])
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


def _hub_error(spec: ModelSpec, err: Exception) -> ModelError:
    hub = spec.source.get("hub")
    return ModelError(
        f"model {spec.name!r}: could not load hub id {hub!r} (revision {spec.source.get('revision', 'main')!r}): {err}. "
        f"Without a network, download it elsewhere (`hf download {hub} --local-dir DIR`) and set "
        f"`source: {{path: DIR}}` for this model in the config, or fill the Hugging Face cache and set HF_HUB_OFFLINE=1."
    )


def model_kind(config, spec: ModelSpec) -> str:
    """'encoder' (bidirectional, [CLS]/[SEP]) or 'decoder' (causal, BOS)."""
    if spec.arch != "auto":
        return spec.arch
    mt = getattr(config, "model_type", "")
    if mt in ENCODER_TYPES:
        return "encoder"
    if mt in DECODER_TYPES or getattr(config, "is_decoder", False):
        return "decoder"
    raise ModelError(f"model {spec.name!r}: cannot tell whether model type {mt!r} is an encoder or a decoder; set arch")


def pick_device(spec: ModelSpec) -> str:
    import torch

    if spec.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"model {spec.name!r}: device 'cuda' requested but no CUDA device is visible")
    return spec.device


def load(spec: ModelSpec, cache_dir: str | Path | None = None, device: str | None = None):
    """Load (model, tokenizer) with eager attention, in eval mode, on ``device``."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    loc, kwargs = resolve(spec, cache_dir)
    try:
        config = AutoConfig.from_pretrained(loc, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
        model = AutoModel.from_pretrained(loc, attn_implementation="eager", dtype=_torch_dtype(spec.dtype), **kwargs)
    except OSError as e:
        if spec.source_kind == "hub":
            raise _hub_error(spec, e) from e
        raise ModelError(f"model {spec.name!r}: cannot load from {loc}: {e}") from e
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"model {spec.name!r}: tokenizer {type(tokenizer).__name__} is not a fast tokenizer; offsets are needed")
    model.eval()
    model.to(device or pick_device(spec))
    return model, tokenizer, config


def dequantize_gguf(spec: ModelSpec, out_dir: str | Path) -> dict:
    """Dequantise a GGUF model once into an fp32 ``save_pretrained`` directory (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_file(spec)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quant = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = quant.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    # The GGUF-loaded model refuses save_pretrained; copy its dequantised weights into a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quant.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ModelError(f"model {spec.name!r}: GGUF weights do not match the architecture: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return {"gguf": str(path), "model_type": config.model_type, "layers": config.num_hidden_layers}


def embedding_parameters(model) -> list[str]:
    """Names of the word and (learned, absolute) position embedding parameters."""
    names = []
    words = model.get_input_embeddings()
    for name, module in model.named_modules():
        if module is words or name.endswith(("position_embeddings", "wpe", "embed_positions")):
            names += [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
    return names


def random_init_model(base: ModelSpec, base_dir: str | Path | None, seed: int, out_dir: str | Path) -> dict:
    """Write ``base`` with every weight re-initialised (``torch.manual_seed(seed)``, the
    architecture's own initialiser) except the word and position embeddings, which keep
    their pretrained values (atomic ``save_pretrained`` directory with the tokenizer)."""
    import json

    import torch
    from transformers import AutoModel

    pretrained, tokenizer, config = load(base, base_dir, device="cpu")
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
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"base": base.name, "seed": seed, "kept": keep, "model_type": config.model_type}
    (tmp / "random_init.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return info


def package_versions() -> dict[str, str]:
    out = {}
    for p in ("torch", "transformers", "tokenizers", "h5py", "numpy", "headatlas"):
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out
