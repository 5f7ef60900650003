# The Snakefile puts scripts/ on sys.path and PYTHONPATH: the workflow and its jobs import the headatlas library.
import functools
import json
import os
import re
from pathlib import Path

import yaml
from snakemake.logging import logger
from snakemake.utils import validate

from headatlas.core import config_checks
from headatlas.core.inputs import (
    canonical,
    corpus_build_spec,
    check_yaml,
    config_bases,
    config_chain,
    extend_config,
    map_setting,
    model_files,
    next_steps,
    other_run_warning,
    uncached_hub_warning,
)
from headatlas.core.integrity import damaged
from headatlas.core.models import ModelError, ModelSpec, job_gpus, weights_dir
from headatlas.core.store import store_problem
from headatlas.fused import PLANS, reducer_specs


def config_error(message):
    """Stop the parse with ``message`` alone: a config error is one to three lines naming its key path (a raised
    exception would add Snakemake's traceback of this file)."""
    logger.error(message)
    raise SystemExit(1)


# Snakemake has loaded the --configfile files already (a syntax error stops it before this
# line; its message names no line, `--verbose` shows the parser's): catch duplicate keys.
for _f in workflow.overwrite_configfiles or []:
    try:
        check_yaml(_f)
    except ValueError as e:
        config_error(str(e))

SCHEMAS = Path(workflow.basedir) / "workflow" / "schemas"


def validated(data, schema, where=""):
    """Validate (and fill the defaults of) ``data`` against a schema of workflow/schemas/: a config error is
    one line naming its key path (config_checks.schema_problem); Snakemake's own message, with the whole schema
    and config, when HEADATLAS_SCHEMA_DUMP=1."""
    if not os.environ.get(config_checks.SCHEMA_DUMP_ENV):
        schema_dict = yaml.safe_load((SCHEMAS / Path(schema).name).read_text())
        problem = config_checks.schema_problem(data, schema_dict, where)
        if problem:
            config_error(
                f"config key {problem}\n(every detail: {config_checks.SCHEMA_DUMP_ENV}=1 snakemake ...)"
            )
    validate(data, schema)


# `extends:` in a --configfile: the configs it names go under it, and its `add_models:` / `add_corpora:` are
# added to theirs (config/README.md); nothing else is merged in (the Snakefile reads config/config.yaml only
# when no --configfile is given).
_files = [str(f) for f in workflow.overwrite_configfiles or []]
try:
    _merged = extend_config(
        config_bases(_files), dict(config), ", ".join(_files) or "config"
    )
except ValueError as e:
    config_error(str(e))
config.clear()
config.update(_merged)
config.pop("extends", None)
validated(config, "../schemas/config.schema.yaml")
# every dict in sorted key order: the same config in any key order plans nothing (docs/integrity.md)
_canonical = canonical(dict(config))
config.clear()
config.update(_canonical)


# names and cross-references, then every input file, then models (headatlas.core.config_checks: each check's
# message names the key); on every run, whatever results/ holds already
try:
    config_checks.check_config(config)
    config_checks.check_input_paths(config)
    # maps: full | sample | none per corpus (docs/reduction.md): checked here, by key
    CORPUS_MAPS = {
        c: map_setting(spec, f"corpora.{c}") for c, spec in config["corpora"].items()
    }
    MODELS = config_checks.resolve_models(
        config
    )  # by name; a derived model with its base's settings
    config_checks.check_packages(MODELS)
    _model_warnings = config_checks.check_models(config, MODELS)
except (ValueError, ModelError) as e:
    config_error(str(e))
for _warning in _model_warnings:
    logger.warning(_warning)
# a model no analysis or no atlas covers (a `models:` list leaves it out)
if workflow.is_main_process:
    for _warning in config_checks.coverage_warnings(config, MODELS):
        logger.warning(_warning)

# hub-id models not in the local cache (config/paper.yaml offline): said once, by the main process
if workflow.is_main_process:
    _uncached = uncached_hub_warning(
        [ModelSpec.from_config(m) for m in MODELS.values()]
    )
    if _uncached:
        logger.warning(_uncached)


# the config files of this run, recorded when it succeeds: a later run of a config that does not extend them
# is warned that it rebuilds what they differ in (README "Add a model")
RUN_RECORD = ".snakemake/headatlas_last_run.json"
RUN_CONFIGS = config_chain(_files or ["config/config.yaml"])
if workflow.is_main_process and Path("results").is_dir():
    _other = other_run_warning(RUN_RECORD, RUN_CONFIGS)
    if _other:
        logger.warning(_other)


onsuccess:
    if Path(".snakemake").is_dir():
        Path(f"{RUN_RECORD}.tmp").write_text(json.dumps({"configs": RUN_CONFIGS}))
        os.replace(f"{RUN_RECORD}.tmp", RUN_RECORD)
    for _line in next_steps(
        workflow.overwrite_configfiles or [], "results/atlas/index.html"
    ):
        logger.info(_line)


CORPORA = config["corpora"]
EXTRACTION = config["extraction"]


def corpus_model(model, corpus):
    """The model's settings on one corpus: a corpus with `tokens` (wikitext_long) sets max_length."""
    return config_checks.corpus_model(config, MODELS, model, corpus)


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
    return config_checks.rule_model_dir(model, MODELS[model]["source"])


def model_source(model):
    """What of a model entry changes the directory cache_model / assemble_model write: its name and source (so
    editing its batch_size or max_length does not rebuild the cache and re-extract every corpus).
    """
    return {"name": model, "source": MODELS[model]["source"]}


def model_inputs(model):
    """What a model is loaded from (inputs of the jobs that load it). The directory its own rule writes, else its
    local config, weights and tokenizer files (so new weights re-extract; [] for a hub id).
    """
    d = model_dir(model)
    return [d] if d else model_files(ModelSpec.from_config(MODELS[model]))


def model_cache(wildcards):
    return model_inputs(wildcards.model)


def finetune_inputs(wildcards):
    ft = MODELS[wildcards.model]["source"]["finetuned"]
    task = config["finetune_tasks"][ft["task"]]
    return {
        "train": task["train"],
        "dev": task["dev"],
        "base": model_inputs(ft["base"]),
    }


def finetune_params(wildcards):
    ft = MODELS[wildcards.model]["source"]["finetuned"]
    return {
        "base": MODELS[ft["base"]],
        "task": dict(config["finetune_tasks"][ft["task"]], name=ft["task"]),
    }


def random_init_inputs(wildcards):
    return {
        "base": model_inputs(MODELS[wildcards.model]["source"]["random_init"]["base"])
    }


def random_init_params(wildcards):
    ri = MODELS[wildcards.model]["source"]["random_init"]
    return {"base": MODELS[ri["base"]], "seed": ri.get("seed", 0)}


def model_corpora(model):
    """The corpora extracted for a model: its own `corpora` list, or all; without the corpora
    whose own `models` list leaves it out."""
    return config_checks.model_corpora(config, MODELS, model)


def helper_models():
    """Models with their own `corpora` list: baselines that get no analysis targets of their own."""
    return config_checks.helper_models(MODELS)


def extraction_params(model, corpus_name):
    """Everything that changes a model's maps on one corpus (and nothing else); for a fused corpus also
    the reducers' specs (so a reducer setting reruns this extraction only)."""
    corpus = CORPORA[corpus_name]
    mode, k = CORPUS_MAPS[corpus_name]
    out = {
        "model": corpus_model(model, corpus_name),
        # a long corpus is cut to its `tokens`
        "overflow": corpus.get(
            "overflow", "truncate" if "tokens" in corpus else EXTRACTION["overflow"]
        ),
        "storage_dtype": EXTRACTION["storage_dtype"],
        "maps": mode == "full",
        "reps": corpus.get("reps", True),
        "rep_position": EXTRACTION["rep_position"],
    }
    specs = fused_specs(model, corpus_name)
    if (
        specs or mode == "sample"
    ):  # a maps: none corpus no analysis reduces only keeps representations
        out["fused"] = {
            "reducers": specs,
            "sample": k,
            "seed": int(corpus.get("seed", 0)),
            "attention": EXTRACTION["attention"],
            "cpu_pass": EXTRACTION["cpu_pass"] or "off",  # YAML: a bare off is false
        }
    return out


# --- fused reduction (headatlas.fused): the reducers of every active analysis on a non-full corpus -----------
# analysis key -> function(model, corpus) -> files its reducers need as the extraction's `trees` input
FUSED_TREES = {}
# analysis key -> function() -> helper models whose maps it reads (e.g. Clark's random-init baseline)
FUSED_HELPERS = {}


def fused_sections(model):
    """key -> section of every active analysis with a fused plan that covers the model (or reads its maps
    as a helper model)."""
    return {
        key: ANALYSES[key]
        for key in PLANS
        if key in ANALYSES
        and (model in analysis_models(key) or model in FUSED_HELPERS.get(key, list)())
    }


def fused_specs(model, corpus):
    """The reducer specs a fused extraction of (model, corpus) runs ([] for a full corpus)."""
    if CORPUS_MAPS[corpus][0] == "full":
        return []
    return reducer_specs(fused_sections(model), corpus)


def fused_trees(model, corpus):
    """The parse (at most one) the reducers of a fused extraction read their trees from."""
    specs = fused_specs(model, corpus)
    files = sorted(
        {
            f
            for key in {s["analysis"] for s in specs}
            if key in FUSED_TREES
            for f in FUSED_TREES[key](corpus)
        }
    )
    if len(files) > 1:
        raise ValueError(
            f"corpus {corpus}: fused reducers would need trees from {files}; give its analyses one source of trees"
        )
    return files


config_checks.check_corpus_lengths(config, MODELS)


def uses_gpu(model):
    """The gpu resource of a model-running job: for a model with device cuda, or device auto when config
    gpu_jobs is true (profiles/slurm-gpu), the GPUs it needs (model_gpus); else 0.
    """
    device = MODELS[model].get("device", "auto")
    wants = device == "cuda" or (device == "auto" and config["gpu_jobs"])
    return model_gpus(model) if wants else 0


@functools.cache
def model_gpus(model):
    """GPUs of one job of the model: its gpus key, else with a device_map as many GPUs of config
    gpu_memory_gb as its weights need (read from its local checkpoint), else 1 (headatlas.core.models.job_gpus).
    """
    spec = ModelSpec.from_config(MODELS[model])
    loc = weights_dir(spec, model_dir(model)) if spec.device_map else None
    return job_gpus(spec, loc, int(config["gpu_memory_gb"] * 1e9))


def extract_model_rule(model):
    """The name of the per-model extraction rule (when extraction.jobs is model)."""
    safe = re.sub(r"\W", "_", model)
    return f"extract_attention_{safe}"


def extraction_targets():
    return [
        d
        for model in MODELS
        for corpus in model_corpora(model)
        for d in shard_dirs(model, corpus)
    ]


# --- The analysis contract (docs/architecture.md) ---------------------------------------
# An analysis is one section of config['analysis'] with its own schema. It is on when the
# section is present and its `activate` key (default true) is true; an absent section is off.
# Every rule file declares itself with analysis_section() (defaults filled even when off, so
# its rules parse) and register_targets(); only common.smk helpers decide who is covered, so
# the include order of the rule files does not matter (atlas.smk reads other analyses only
# through these helpers and the registry headatlas.atlas.analysis.ATLAS_SOURCES).

# sections as the user wrote them (before defaults), to tell present from absent
_GIVEN_SECTIONS = set(config["analysis"])
# analyses on by default when their section is absent (the atlas joins whatever exists)
ON_WHEN_ABSENT = {"atlas"}
ANALYSES = {}


def analysis_section(key, schema):
    """Validate (and fill defaults of) config['analysis'][key] against its own schema file."""
    section = config["analysis"].setdefault(key, {})
    # the atlas's surface corpus: wiki, else the first of Clark's surface corpora
    if key == "atlas":
        section = config_checks.surface_corpus_default(config, section)
    # as written (the schema fills defaults in place)
    given = json.loads(json.dumps(section))
    validated(section, schema, f"analysis.{key}")
    config["analysis"][key] = section = canonical(
        section
    )  # its defaults in sorted key order too
    ANALYSES[key] = section
    if analysis_active(key):  # every corpus and model it names, its defaults included
        try:
            config_checks.check_section(config, key, section, given, _GIVEN_SECTIONS)
        except ValueError as e:
            config_error(str(e))
    return section


def analysis_active(key):
    """The single on/off switch: the section is present (or on by default) and `activate` is true."""
    present = key in _GIVEN_SECTIONS or key in ON_WHEN_ABSENT
    return present and bool(ANALYSES[key].get("activate", True))


def analysis_models(key):
    """The models an analysis covers: its `models` list (default all), never a helper model."""
    if not analysis_active(key):
        return []
    # its names are checked by analysis_section
    listed = ANALYSES[key].get("models") or list(MODELS)
    helpers = helper_models()
    return [m for m in listed if m not in helpers]


def analysis_corpora(key, model):
    """The corpora of the analysis's `corpora` list that are extracted for the model
    (None when the analysis names its corpora otherwise)."""
    corpora = ANALYSES[key].get("corpora")
    if corpora is None:
        return None
    return [c for c in corpora if c in model_corpora(model)]


TARGET_FUNCTIONS = {"extraction": extraction_targets}


def register_targets(key, function):
    """Declare the final outputs of analysis `key` (a function returning paths; called only when it is on)."""
    TARGET_FUNCTIONS[key] = function


def all_targets():
    """Every target of every active analysis (the helper-model filter is analysis_models())."""
    return [
        t
        for key, f in TARGET_FUNCTIONS.items()
        if key == "extraction" or analysis_active(key)
        for t in f()
    ]


# --- store integrity (owner: the attention store, headatlas.core.store) ---------------------------
# A store whose manifest is missing, of an old layout, or lists a file that is missing or has another
# size (truncated, replaced, deleted) is damaged: warn naming the file, and date it back to the epoch
# so that Snakemake sees it older than its inputs and reruns its extraction (in a dry run too).
def _rerun_damaged_stores():
    for d in extraction_targets():
        problem = store_problem(d)
        if problem:
            logger.warning(
                f"damaged attention store, its extraction will rerun: {problem}"
            )
            stamp = Path(d) / ".snakemake_timestamp"
            if stamp.exists():
                os.utime(stamp, (0, 0))
            os.utime(d, (0, 0))


_rerun_damaged_stores()


# --- integrity of every other sealed output (owner: headatlas.core.integrity; docs/integrity.md) ------------
# A sealed file that no longer matches its <file>.sha256 (or a sealed model directory whose files changed size)
# is dated back to the epoch like a damaged store, so that its job reruns.
def _rerun_damaged_outputs():
    for path, problem in damaged("results"):
        logger.warning(f"damaged output, its job will rerun: {problem}")
        stamp = Path(path) / ".snakemake_timestamp"
        if stamp.exists():
            os.utime(stamp, (0, 0))
        os.utime(path, (0, 0))


_rerun_damaged_outputs()

# predicted peak memory of the model-running rules against this machine's or --resources mem_mb (docs/plan.md)
from headatlas.core.plan import memory_warnings, model_weights_mb


@functools.lru_cache(maxsize=None)
def weights_mb(model):
    return model_weights_mb(model, MODELS)


def model_mem_mb(base, model=None):
    """mem_mb of a job that holds a model (a SLURM job's --mem): the rule's base plus the model's weights;
    for ``model`` (a per-model rule) a number, else a function of the job's ``model`` wildcard.
    """
    if model is not None:
        return base + weights_mb(model)
    return lambda wc: base + weights_mb(wc.model)


def _runs_on(analysis, model):
    """Whether this run runs an analysis's model-running rules (None: extraction) on a model."""
    return (
        model in analysis_models(analysis) if analysis else bool(model_corpora(model))
    )


def warn_predicted_memory():
    """Called by the Snakefile once every analysis section is read."""
    if workflow.is_main_process:
        for w in memory_warnings(
            config, MODELS, workflow.global_resources.get("mem_mb"), runs=_runs_on
        ):
            logger.warning(w)
