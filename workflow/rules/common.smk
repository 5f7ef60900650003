import json
from pathlib import Path

from snakemake.utils import validate

validate(config, "../schemas/config.schema.yaml")


def _check_config():
    names = [m["name"] for m in config["models"]]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"config key models: duplicate model names {dups}")
    for key, spec in config["analysis"].items():
        for corpus in spec.get("corpora", []):
            if corpus not in config["corpora"]:
                raise ValueError(
                    f"config key analysis.{key}.corpora: unknown corpus {corpus!r}; "
                    f"known: {sorted(config['corpora'])}"
                )


_check_config()


def _resolve_models(entries):
    """Model entries by name; a fine-tuned model inherits its base's settings."""
    models = {m["name"]: dict(m) for m in entries}
    for name, m in models.items():
        ft = m["source"].get("finetuned")
        if ft is None:
            continue
        base = models.get(ft["base"])
        if base is None or "finetuned" in base["source"]:
            raise ValueError(
                f"config key models[{name}].source.finetuned.base: {ft['base']!r} is not a "
                "(non-fine-tuned) model of this config"
            )
        if ft["task"] not in config.get("finetune_tasks", {}):
            raise ValueError(
                f"config key models[{name}].source.finetuned.task: {ft['task']!r} is not a key of finetune_tasks"
            )
        user = {k for k in entries[[e["name"] for e in entries].index(name)]}
        for key, value in base.items():
            if key not in user and key not in ("name", "source"):
                m[key] = value
    return models


MODELS = _resolve_models(config["models"])
CORPORA = config["corpora"]
EXTRACTION = config["extraction"]


wildcard_constraints:
    model="[A-Za-z0-9_.-]+",
    corpus="[A-Za-z0-9_.-]+",
    shard=r"\d+",
    nshards=r"\d+",


def n_shards(corpus):
    return int(CORPORA[corpus].get("shards", EXTRACTION["shards"]))


def shard_dirs(model, corpus):
    n = n_shards(corpus)
    return [f"results/attention/{model}/{corpus}/shard{i}of{n}" for i in range(n)]


def corpus_paths(corpus):
    spec = CORPORA[corpus]
    return spec["paths"] if "paths" in spec else [spec["path"]]


def model_dir(model):
    """The directory a model is loaded from when a rule of this workflow writes it."""
    source = MODELS[model]["source"]
    if "gguf" in source:
        return f"results/models/gguf/{model}"
    if "finetuned" in source:
        return f"results/models/finetuned/{model}"
    return None


def model_cache(wildcards):
    d = model_dir(wildcards.model)
    return [d] if d else []


def finetune_inputs(wildcards):
    ft = MODELS[wildcards.model]["source"]["finetuned"]
    task = config["finetune_tasks"][ft["task"]]
    base = model_dir(ft["base"])
    return {"train": task["train"], "dev": task["dev"], "base": [base] if base else []}


def finetune_params(wildcards):
    ft = MODELS[wildcards.model]["source"]["finetuned"]
    return {
        "base": MODELS[ft["base"]],
        "task": dict(config["finetune_tasks"][ft["task"]], name=ft["task"]),
    }


def extraction_params(wildcards):
    """Everything that changes a model's maps on one corpus (and nothing else)."""
    corpus = CORPORA[wildcards.corpus]
    return {
        "model": MODELS[wildcards.model],
        "overflow": corpus.get("overflow", EXTRACTION["overflow"]),
        "storage_dtype": EXTRACTION["storage_dtype"],
        "maps": corpus.get("maps", True),
        "reps": corpus.get("reps", True),
        "rep_position": EXTRACTION["rep_position"],
    }


def uses_gpu(model):
    return 1 if MODELS[model].get("device", "auto") == "cuda" else 0


def extraction_targets():
    return [
        d for model in MODELS for corpus in CORPORA for d in shard_dirs(model, corpus)
    ]


# Each analysis rule file appends a function returning its final outputs.
TARGET_FUNCTIONS = [extraction_targets]


def validate_section(key, schema):
    """Validate (and fill defaults of) config['analysis'][key] against its own schema file."""
    section = config["analysis"].setdefault(key, {})
    validate(section, schema)
    return section


def all_targets():
    return [t for f in TARGET_FUNCTIONS for t in f()]
