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

MODELS = {m["name"]: m for m in config["models"]}
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


def is_gguf(model):
    return "gguf" in MODELS[model]["source"]


def model_cache(wildcards):
    return [f"results/models/{wildcards.model}"] if is_gguf(wildcards.model) else []


def extraction_params(wildcards):
    """Everything that changes a model's maps on one corpus (and nothing else)."""
    corpus = CORPORA[wildcards.corpus]
    return {
        "model": MODELS[wildcards.model],
        "overflow": corpus.get("overflow", EXTRACTION["overflow"]),
        "storage_dtype": EXTRACTION["storage_dtype"],
    }


def uses_gpu(model):
    return 1 if MODELS[model].get("device", "auto") == "cuda" else 0


def extraction_targets():
    return [
        d for model in MODELS for corpus in CORPORA for d in shard_dirs(model, corpus)
    ]


def all_targets():
    targets = extraction_targets()
    for corpus in config["analysis"]["surface"]["corpora"]:
        targets += expand(
            "results/surface/{model}/{corpus}.tsv", model=MODELS, corpus=corpus
        )
    return targets
