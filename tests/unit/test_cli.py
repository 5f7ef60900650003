"""The headatlas command: ``headatlas store [describe] DIR...`` and ``headatlas store verify DIR...``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from headatlas.cli import main
from unit.core.test_store import N_HEADS, N_LAYERS, make_tokenized, random_maps, write_store


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    tokenized = [make_tokenized(n, i) for i, n in enumerate([5, 9, 3])]
    maps = [[random_maps(rng, len(t)) for t in tokenized] for _ in range(N_LAYERS)]
    ids = ["a", "b", "c"]
    meta = lambda s: {"model": "m", "corpus": "c", "model_kind": "encoder", "shard": s, "n_shards": 2}  # noqa: E731
    return [
        write_store(tmp_path / "shard0of2", tokenized[:1], [m[:1] for m in maps], ids[:1], meta=meta(0)),
        write_store(tmp_path / "shard1of2", tokenized[1:], [m[1:] for m in maps], ids[1:], meta=meta(1)),
    ]


def test_store_describe_is_the_default(shards, capsys):
    assert main(["store", *map(str, shards)]) == 0
    text = capsys.readouterr().out
    for line in (
        "model           m",
        "corpus          c",
        "shards          0, 1",
        "sequences       3",
        "tokens          17",
        "layout_version  3",
        "map_layout      full",
    ):
        assert line in text
    assert main(["store", "describe", "--json", *map(str, shards)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (
        info["sequences"] == 3
        and info["cells_per_head"] == 25 + 81 + 9
        and (info["layers"], info["heads"]) == (N_LAYERS, N_HEADS)
    )
    assert info["bytes"] == sum(p.stat().st_size for d in shards for p in d.iterdir() if p.name != "manifest.json")


def test_store_accepts_a_corpus_directory_and_points_into_a_results_tree(shards, tmp_path, capsys):
    """A corpus directory stands for its shards in shard order; a directory above the stores lists them."""
    assert main(["store", str(tmp_path)]) == 0  # tmp_path holds shard0of2 and shard1of2
    assert "shards          0, 1" in capsys.readouterr().out
    assert main(["store", "verify", str(tmp_path)]) == 0  # the directory, both shards and the set checked
    assert capsys.readouterr().err.count(": ok") == 1
    corpus = tmp_path / "results" / "attention" / "m" / "c"
    corpus.parent.mkdir(parents=True)
    os.rename(tmp_path / "shard0of2", tmp_path / "x0")
    os.rename(tmp_path / "shard1of2", tmp_path / "x1")
    corpus.mkdir()
    os.rename(tmp_path / "x0", corpus / "shard0of2")
    os.rename(tmp_path / "x1", corpus / "shard1of2")
    for above in (tmp_path / "results", corpus.parent):
        assert main(["store", str(above)]) == 1
        err = capsys.readouterr().err
        assert "not a store; it holds the stores of 1 corpus:" in err and str(corpus) in err


def test_store_verify_exit_status_and_one_line_per_fault(shards, capsys):
    assert main(["store", "verify", *map(str, shards)]) == 0
    assert capsys.readouterr().err.count(": ok") == 2
    os.truncate(shards[1] / "layer_01.h5", 10)
    with open(shards[0] / "meta.json", "r+b") as fh:
        fh.write(b"[")
    assert main(["store", "verify", *map(str, shards)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("FAULT ") for line in out)
    assert "meta.json: sha256 checksum differs" in out[0] and "layer_01.h5: 10 bytes, the manifest says" in out[1]
    assert main(["store", str(shards[1])]) == 1  # describing a damaged store fails too


def test_module_and_console_script_entry(shards):
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    proc = subprocess.run(
        [sys.executable, "-m", "headatlas", "store", "verify", str(shards[0])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr.strip().endswith(": ok"), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "headatlas"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "store" in proc.stderr
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"headatlas": "headatlas.cli:main"}


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["store", "verify"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["nosuchcommand"])
    assert e.value.code == 2


# --- headatlas look / atlas ------------------------------------------------------------------


def _atlas_tsv(path):
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "model": "m",
            "layer": [0, 0, 1, 1],
            "head": [0, 1, 0, 1],
            "clark_behaviour": ["prev", "none", "cls", "broad"],
            "pande_local_sig_fdr": [True, False, False, False],
            "pande_delimiter_sig_fdr": [False, False, True, True],
            "syntax_best_relation": ["nsubj", "obj", "amod", None],
            "syntax_best_margin": [0.10, 0.01, 0.20, None],
        }
    ).to_csv(path, sep="\t", index=False)
    return path


SENTENCE = "the cat sat on the mat , and the dog ran to the cat ."


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_look_numbers_are_the_analysis_numbers(name, tmp_path, tiny_models, tiny_loaded, capsys):
    """The analysis's path on a corpus of this one input (extraction to a store, the rule's reduce_corpus, its
    behaviour labels) and ``look`` on the same input give the same table, to float32 rounding."""
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.clark.surface import STATS, SurfaceSettings, behaviour_table
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.reduce import reduce_corpus
    from headatlas.look import input_record

    spec, model, tokenizer, config = tiny_loaded(name)
    store = tmp_path / "store"
    extract([input_record(SENTENCE)], spec, model, tokenizer, config, store, ExtractSettings(overflow="truncate", maps=True, reps=False), meta={"corpus": "one", "shard": 0, "n_shards": 1})  # fmt: skip
    reducer = SurfaceReducer(SurfaceSettings().smoothing)
    want = behaviour_table(reduce_corpus([store], reducer), SurfaceSettings())
    tsv = tmp_path / "look.tsv"
    argv = ["look", str(tiny_models[name]), SENTENCE, "--config", "", "--out", str(tmp_path / "l.png")]
    assert main([*argv, "--results", str(tmp_path), "--tsv", str(tsv), "--max-length", str(spec.max_length)]) == 0
    got = pd.read_csv(tsv, sep="\t")
    assert list(got["label"]) == list(want["label"])
    np.testing.assert_allclose(got[STATS].to_numpy(float), want[STATS].to_numpy(float), rtol=1e-5, atol=1e-6)
    text = capsys.readouterr().out
    lines = {line.split()[0] for line in text.splitlines() if line.startswith("  ")}
    if name == "gpt2":  # a decoder has no next token and no [SEP]: never printed as a number
        assert (
            "next" not in lines and "sep" not in lines and "not defined for this decoder and input: next, sep" in text
        )
    else:
        assert {"next", "prev", "sep", "punct", "entropy"} <= lines


def test_look_input_errors_are_one_line(tmp_path, tiny_models, capsys):
    common = ["--config", "", "--out", str(tmp_path / "l.png"), "--results", str(tmp_path)]
    bert = str(tiny_models["bert"])
    cases = [
        (["look", str(tmp_path / "no" / "such"), "a b", *common], "local model directory " + str(tmp_path / "no" / "such") + " does not exist"),
        (["look", "./models/missing", "a b", *common], "local model directory ./models/missing does not exist"),
        (["look", bert, "   ", *common], "the sentence is empty"),
        (["look", bert, "a b", "--config", str(tmp_path / "nosuch.yaml")], f"config file {tmp_path / 'nosuch.yaml'} does not exist"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    long = " ".join(["word"] * 600)
    assert main(["look", bert, long, *common, "--max-length", "64"]) == 0
    err = capsys.readouterr().err
    assert "the input is cut to its first" in err and "of 600 words" in err and "at most 64 tokens (max_length)" in err


def test_look_cli_has_no_traceback_for_an_empty_sentence(tiny_models):
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    proc = subprocess.run([sys.executable, "-m", "headatlas", "look", str(tiny_models["bert"]), ""],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "the sentence is empty" in proc.stderr


def test_head_roles_and_atlas_summary(tmp_path):
    import pandas as pd

    from headatlas.look import atlas_summary, head_roles

    atlas = pd.read_csv(_atlas_tsv(tmp_path / "atlas.tsv"), sep="\t")
    roles = head_roles(atlas)
    assert roles.to_dict() == {
        "1-1": "clark:prev pande:local syntax:nsubj(+0.10)",
        "1-2": "-",
        "2-1": "clark:cls pande:delimiter syntax:amod(+0.20)",
        "2-2": "clark:broad pande:delimiter",
    }
    summary = atlas_summary(atlas)
    assert summary["heads"] == 4 and summary["layers x heads"] == "2 x 2" and summary["heads with a role"] == 3
    assert summary["Pande et al. (heads hypothesis): heads per role (FDR)"] == {"delimiter": 2, "local": 1}
    assert summary["Clark et al. (syntax): best relation beating its baseline"] == {"nsubj": 1, "amod": 1}


def test_look_on_a_tiny_model(tmp_path, tiny_models, capsys):
    model = tiny_models["bert"]
    out = tmp_path / "look.png"
    argv = ["look", str(model), "the cat sat on the mat .", "--out", str(out), "--results", str(tmp_path / "r")]
    assert main([*argv, "--config", "", "--tsv", str(tmp_path / "s.tsv")]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and out.with_suffix(".svg").is_file() and (tmp_path / "s.tsv").is_file()
    assert "strongest heads per Clark et al. surface statistic" in text and "prev" in text and "no atlas for" in text
    # with an atlas of a finished run: each head's roles
    _atlas_tsv(tmp_path / "r" / "atlas" / model.name / "atlas.tsv")
    assert main([*argv, "--config", ""]) == 0
    text = capsys.readouterr().out
    roles = text[text.index("roles from the atlas") :]
    assert "1-1    clark:prev pande:local" in roles and "1-2" not in roles  # heads without a role are left out


def test_look_unknown_model_and_gpt2_bos(tmp_path, tiny_models, capsys):
    assert main(["look", "nosuchmodel", "a b", "--config", ""]) == 1
    assert "not a model of the config" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"models:\n  - name: g\n    source: {{path: {tiny_models['gpt2']}}}\n    bos_token: none\n"
        "corpora: {e: {kind: conllu, path: x}}\n"
    )
    out = tmp_path / "g.png"
    assert main(["look", "g", "a b c", "--config", str(cfg), "--out", str(out), "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "decoder without a BOS token" in captured.err and out.is_file()
    # a directory (not a config model) with --bos-token: the same warning; with its BOS: none
    gpt2 = str(tiny_models["gpt2"])
    common = ["--config", "", "--out", str(out), "--results", str(tmp_path)]
    assert main(["look", gpt2, "a b c", "--bos-token", "none", *common]) == 0
    assert "decoder without a BOS token" in capsys.readouterr().err
    assert main(["look", gpt2, "a b c", *common]) == 0
    assert "without a BOS" not in capsys.readouterr().err


def test_atlas_command(tmp_path, capsys):
    assert main(["atlas", "m", "--results", str(tmp_path)]) == 1
    assert "no atlas for model 'm' at" in capsys.readouterr().err
    _atlas_tsv(tmp_path / "atlas" / "m" / "atlas.tsv")
    assert main(["atlas", "m", "--results", str(tmp_path), "--heads"]) == 0
    text = capsys.readouterr().out
    assert "heads per role (FDR): delimiter 2, local 1" in text and "2-2    clark:broad pande:delimiter" in text


def _every_family_atlas(path, n_layers=2, n_heads=2):
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    n = len(layer)
    path.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame({"model": "m", "layer": layer, "head": head})
    df["clark_behaviour"] = ["prev", "broad"] * (n // 2)
    df["pande_local_sig_fdr"] = [True, False] * (n // 2)
    df["probe_syntactic_mean_acc"] = np.linspace(0.2, 0.8, n)
    df["det_prev"] = np.linspace(0.9, 0.1, n)
    df["det_prev_sig"] = [True] + [False] * (n - 1)
    df["det_induction"] = np.linspace(0.1, 0.5, n)
    df["det_induction_sig"] = [False] * (n - 1) + [True]
    df["det_sink_head"] = [False, True] * (n // 2)
    df["ablation_lm_loss_effect"] = np.linspace(0.01, 0.5, n)
    df["ablation_lm_loss_effect_kind"] = ["exact", "estimated (checked)", "unreliable", "skipped: no LM head"] * (
        n // 4
    ) + ["exact"] * (n % 4)
    df.to_csv(path, sep="\t", index=False)
    return df


def test_atlas_command_covers_detectors_and_ablations(tmp_path, capsys):
    _every_family_atlas(tmp_path / "atlas" / "m" / "atlas.tsv")
    assert main(["atlas", "m", "--results", str(tmp_path), "--heads"]) == 0
    text = capsys.readouterr().out
    assert "detectors: det_prev (fraction of the row's attention, 0-1): 1 significant (FDR); top 1-1 0.9" in text
    assert "detectors: det_induction" in text and "detectors: sink heads: 2" in text
    # the unreliable (2-1) and skipped (2-2) values are not effects: only 1-1 and 1-2 rank
    assert (
        "ablation: ablation_lm_loss_effect (nats per token): top 1-2 0.173, 1-1 0.01; exact 1, estimated (checked) 1, unreliable 1, skipped 1"
        in text
    )
    assert "Jo & Myaeng (probing): probe_syntactic_mean_acc" in text
    assert "1-1    clark:prev pande:local det:prev" in text and "2-2    clark:broad det:induction sink" in text


def test_atlas_nosuch_lists_the_atlases_and_version(tmp_path, capsys):
    _every_family_atlas(tmp_path / "atlas" / "m" / "atlas.tsv")
    _every_family_atlas(tmp_path / "atlas" / "other" / "atlas.tsv")
    assert main(["atlas", "nosuch", "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no atlas for model 'nosuch'" in err and "atlases in " in err and ": m, other" in err
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    from headatlas import __version__

    assert capsys.readouterr().out.strip() == f"headatlas {__version__}"


def test_atlas_heads_into_a_closed_pipe_ends_quietly(tmp_path):
    _every_family_atlas(tmp_path / "atlas" / "big" / "atlas.tsv", n_layers=100, n_heads=100)
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    cmd = f"{sys.executable} -m headatlas atlas big --results {tmp_path} --heads | head -3"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=300)
    assert len(proc.stdout.splitlines()) == 3 and proc.stderr == "", proc.stderr


def test_look_finds_a_model_a_rule_writes(tmp_path, monkeypatch):
    """A config model a rule writes (GGUF, zip parts, derived) is read from that rule's directory, the workflow's own
    (core.config_checks.rule_model_dir); before it exists, look says which target builds it."""
    from headatlas.core.models import ModelError
    from headatlas.look import look_spec

    monkeypatch.chdir(tmp_path)
    cfg = {
        "models": [
            {"name": "z", "source": {"zip_parts": ["part-001"], "path": "m"}, "max_length": 64},
            {"name": "r", "source": {"random_init": {"base": "z", "seed": 0}}},
        ]
    }
    for name, kind in (("z", "assembled"), ("r", "random_init")):
        with pytest.raises(ModelError, match=f"built by the workflow into results/models/{kind}/{name}, which does"):
            look_spec(name, cfg)
        d = tmp_path / "results" / "models" / kind / name
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        spec, found = look_spec(name, cfg)
        assert found == f"results/models/{kind}/{name}" and spec.max_length == 64  # r: its base's max_length
