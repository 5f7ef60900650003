"""A newcomer's config, after a finished run: the README's "Add a model" recipe (``add_models:``) plans only the
new model's jobs and the cross-model joins, and every config check holds on a second run (a missing input file,
a dangling cross-reference, a misspelt key, a YAML error), each in one to three lines naming the key or file."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from conftest import EWT_DEV, WIKI_TEST, dry_run, output_of, run_snakemake

from headatlas.core.config_checks import SCHEMA_DUMP_ENV, check_input_paths, coverage_warnings, resolve_models
from headatlas.core.inputs import ConfigError, config_chain, extend_config, other_run_warning
from integration.test_workflow import model_entry

PROFILE_NOTE = "Using workflow specific profile"  # Snakemake's own first line on every run of this workflow


def base_config(tiny_models) -> dict:
    """The finished run's config: two tiny encoders, Clark's surface analysis on wiki, the atlas with its page."""
    return {
        "models": [model_entry(m, tiny_models[m]) for m in ("bert", "electra")],
        "corpora": {
            "ewt": {"kind": "conllu", "path": str(EWT_DEV), "limit": 8},
            "wiki": {
                "kind": "wikitext",
                "path": str(WIKI_TEST),
                "n_segments": 4,
                "max_words": 30,
                "seed": 0,
                "overflow": "truncate",
            },
        },
        "analysis": {
            "clark_surface": {
                "corpora": ["wiki"],
                "gradients": {"n_segments": 2},
                "clustering": {"n_segments": 4, "permutations": 10},
            },
            "atlas": {"bootstrap": 100, "page": {"corpus": "ewt"}},
        },
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_models):
    """A finished run of base.yaml (run through a config.yaml that extends it, as a user's recipe does)."""
    workdir = tmp_path_factory.mktemp("newcomer")
    (workdir / "base.yaml").write_text(yaml.safe_dump(base_config(tiny_models), sort_keys=False), encoding="utf-8")
    proc = run_snakemake(workdir, {"extends": "base.yaml"})
    assert proc.returncode == 0, output_of(proc)[-6000:]
    return workdir


def error_lines(workdir, config: dict) -> list[str]:
    """The lines a dry run that must fail at parse time prints (without Snakemake's profile note)."""
    proc = run_snakemake(workdir, config, "--dry-run")
    text = output_of(proc)
    assert proc.returncode != 0, text[-3000:]
    return [line for line in text.splitlines() if line.strip() and not line.startswith(PROFILE_NOTE)]


# --- the README recipe ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_add_models_after_a_run_plans_only_the_new_model_and_the_joins(finished, tiny_models):
    recipe = {"extends": "base.yaml", "add_models": [model_entry("gpt2", tiny_models["gpt2"])]}
    stats, jobs, text = dry_run(finished, recipe)
    per_model = {rule for rule, wc in jobs if "model" in wc}
    assert {wc["model"] for rule, wc in jobs if "model" in wc} == {"gpt2"}, text[-4000:]
    assert {"extract_attention", "clark_surface_stats", "atlas"} <= per_model
    joins = {rule for rule, wc in jobs if "model" not in wc}
    assert joins == {"atlas_cross_model", "atlas_page", "all"}, text[-4000:]  # no corpus is prepared again
    assert "results/ holds the run" not in text  # the recipe extends the run's config
    # the old models stay in the page: its job graph joins three atlas jobs, two of them done (dashed)
    proc = run_snakemake(finished, recipe, "--dag", "dot", "--", "results/atlas/index.html")
    found = re.findall(r'^\s*(\d+)\[label = "(\w+)[^"]*".*style="([^"]*)"', proc.stdout, re.M)
    page = next(i for i, name, _ in found if name == "atlas_page")
    atlas = {i: style for i, name, style in found if name == "atlas"}
    parents = [i for i, j in re.findall(r"^\s*(\d+) -> (\d+)$", proc.stdout, re.M) if j == page and i in atlas]
    assert sorted("dashed" in atlas[i] for i in parents) == [False, True, True], proc.stdout[-3000:]


# --- checks that hold on a second run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_missing_corpus_file_after_a_run_stops_the_parse(finished):
    gone = f"{EWT_DEV}x"
    lines = error_lines(finished, {"extends": "base.yaml", "corpora": {"ewt": {"path": gone}}})
    assert lines == [f"config key corpora.ewt.path: no such file {gone} (relative paths start at {finished})"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "analysis, message",
    [
        (
            {"atlas": {"surface_corpus": "ewt"}},
            "config key analysis.atlas.surface_corpus: 'ewt' is not one of analysis.clark_surface.corpora ['wiki']; "
            "the atlas's surface columns come from one of them",
        ),
        (
            {"clark_surface": {"models": ["bert", "electra", "bret"]}},
            "config key analysis.clark_surface.models: unknown models ['bret']; known: ['bert', 'electra']",
        ),
        (
            {"atlas": {"page": {"corpus": "ewt_dev"}}},
            "config key analysis.atlas.page.corpus: unknown corpus 'ewt_dev'; known: ['ewt', 'wiki']",
        ),
    ],
)
def test_a_dangling_cross_reference_stops_the_parse(finished, analysis, message):
    assert error_lines(finished, {"extends": "base.yaml", "analysis": analysis}) == [message]


@pytest.mark.slow
@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"analysis": {"clark_surface": {"smothing": 0.01}}},
            "config key analysis.clark_surface.smothing: unknown key; did you mean smoothing?",
        ),
        ({"corpra": {"wiki": {"n_segments": 2}}}, "config key corpra: unknown key; did you mean corpora?"),
    ],
)
def test_a_misspelt_key_is_named_in_two_lines(finished, config, message):
    lines = error_lines(finished, {"extends": "base.yaml", **config})
    assert lines == [message, f"(every detail: {SCHEMA_DUMP_ENV}=1 snakemake ...)"]


@pytest.mark.slow
def test_the_schema_dump_on_request(finished, monkeypatch):
    monkeypatch.setenv(SCHEMA_DUMP_ENV, "1")
    lines = error_lines(finished, {"extends": "base.yaml", "corpra": {}})
    assert any("'corpra' was unexpected" in line for line in lines) and len(lines) > 50


@pytest.mark.slow
def test_a_yaml_error_in_an_extended_config_names_file_line_and_column(finished):
    (finished / "broken.yaml").write_text("extends: base.yaml\ncorpora:\n  ewt: {limit: 3\n", encoding="utf-8")
    (line,) = error_lines(finished, {"extends": "broken.yaml"})
    assert line.startswith(f"{finished / 'broken.yaml'}:4:1: YAML syntax error: "), line


# --- add_models / add_corpora and the coverage warnings (library) -----------------------------------------------


def test_extend_config_adds_models_and_corpora():
    base = {
        "models": [{"name": "a"}, {"name": "b"}],
        "corpora": {"x": {"kind": "tsv", "models": ["a"]}, "y": {"kind": "tsv"}},
        "analysis": {"pande": {"models": ["a", "b"]}, "atlas": {"models": []}, "circuits": {"models": ["b"]}},
    }
    kept = copy.deepcopy(base)
    over = {
        "add_models": [{"name": "c"}],
        "add_corpora": {"z": {"kind": "tsv"}},
        "analysis": {"circuits": {"models": ["b"]}},  # restated: c stays out
    }
    out = extend_config(base, over)
    assert [m["name"] for m in out["models"]] == ["a", "b", "c"]
    assert out["corpora"]["x"]["models"] == ["a", "c"] and "models" not in out["corpora"]["y"]
    assert out["corpora"]["z"] == {"kind": "tsv"}
    assert out["analysis"]["pande"]["models"] == ["a", "b", "c"]
    assert out["analysis"]["atlas"]["models"] == [] and out["analysis"]["circuits"]["models"] == ["b"]
    assert base == kept  # the base is not changed
    with pytest.raises(ConfigError, match=r"my.yaml: config key add_models: \['b'\] already in models"):
        extend_config(base, {"add_models": [{"name": "b"}]}, "my.yaml")
    with pytest.raises(ConfigError, match=r"config key add_corpora: \['x'\] already in corpora"):
        extend_config(base, {"add_corpora": {"x": {"kind": "tsv"}}})


def test_coverage_warnings_name_the_lists_that_leave_a_model_out():
    config = {
        "models": [{"name": n, "source": {"path": "m"}} for n in ("a", "b")]
        + [{"name": "h", "source": {"random_init": {"base": "a"}}, "corpora": ["x"]}],
        "analysis": {"pande": {"models": ["a"]}, "detectors": {"models": ["a"]}, "atlas": {"models": ["a"]}},
    }
    models = resolve_models(config)
    assert coverage_warnings(config, models) == [
        "model 'b' is in no analysis: analysis.pande.models, analysis.detectors.models, analysis.atlas.models "
        "leave it out; add it there"
    ]
    config["analysis"]["pande"]["models"] = []  # every model
    assert coverage_warnings(config, models) == [
        "model 'b' is not in the atlas page and tables: analysis.atlas.models leaves it out"
    ]
    del config["analysis"]["atlas"]  # absent: on, every model
    assert coverage_warnings(config, models) == []


def test_check_input_paths_names_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").write_text("a\t1\n")
    config = {
        "corpora": {"gen": {"kind": "records", "path": "results/probing/x.jsonl.gz"}},  # a rule writes it
        "finetune_tasks": {"t": {"train": "train.tsv", "dev": "dev.tsv"}},
        "analysis": {},
    }
    with pytest.raises(ValueError, match=r"^config key finetune_tasks\.t\.dev: no such file dev\.tsv"):
        check_input_paths(config)
    config["finetune_tasks"]["t"]["dev"] = "train.tsv"
    config["corpora"]["two"] = {"kind": "tsv", "paths": ["train.tsv", "nope.tsv"]}
    with pytest.raises(ValueError, match=r"^config key corpora\.two\.paths\[1\]: no such file nope\.tsv"):
        check_input_paths(config)


def test_a_config_that_does_not_extend_the_last_run_is_warned(tmp_path):
    for name, data in {
        "config.yaml": {"models": []},
        "quick.yaml": {"extends": "config.yaml", "corpora": {"wiki": {"n_segments": 3}}},
        "my.yaml": {"extends": "config.yaml"},  # the README recipe extending the default after the quick run
        "mine.yaml": {"extends": ["quick.yaml"], "add_models": [{"name": "m"}]},
        "top.yaml": {"extends": "quick.yaml"},  # sets nothing itself
    }.items():
        (tmp_path / name).write_text(yaml.safe_dump(data))
    chain = {n: config_chain([tmp_path / n]) for n in ("quick.yaml", "my.yaml", "mine.yaml", "config.yaml", "top.yaml")}
    assert chain["mine.yaml"] == [str(tmp_path / n) for n in ("mine.yaml", "quick.yaml", "config.yaml")]
    record = tmp_path / "last_run.json"
    assert other_run_warning(record, chain["my.yaml"]) is None  # no run yet
    record.write_text(json.dumps({"configs": chain["quick.yaml"]}))
    assert other_run_warning(record, chain["my.yaml"], cwd=tmp_path) == (
        "results/ holds the run of quick.yaml; my.yaml does not extend quick.yaml: where their corpora or settings "
        "differ, that run's outputs are rebuilt with this config's (to add to that run, extend quick.yaml: README, "
        "Add a model)"
    )
    for fine in ("mine.yaml", "quick.yaml", "config.yaml"):  # extends it, is it, or is part of it
        assert other_run_warning(record, chain[fine]) is None, fine
    record.write_text(json.dumps({"configs": chain["top.yaml"]}))  # a file that only extends another: no settings
    assert other_run_warning(record, chain["mine.yaml"]) is None
