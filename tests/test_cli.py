"""The headatlas command: ``headatlas store [describe] DIR...`` and ``headatlas store verify DIR...``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from conftest import REPO
from test_store import N_HEADS, N_LAYERS, make_tokenized, random_maps, write_store

from headatlas.cli import main


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


def test_pattern_scores_on_hand_built_maps():
    from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP
    from headatlas.core.look import pattern_scores, strongest_heads

    prev = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32)  # row i -> i-1
    first = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0]], dtype=np.float32)  # everything -> [CLS]
    maps = np.stack([prev, first])[None]  # 1 layer x 2 heads
    s = pattern_scores(maps, [SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP], ["[CLS]", "a", "[SEP]"])
    assert list(s["label"]) == ["1-1", "1-2"]
    np.testing.assert_allclose(s["prev"], [1.0, 0.5])
    np.testing.assert_allclose(s["next"], [0.0, 0.0])
    np.testing.assert_allclose(s["first"], [2 / 3, 1.0])
    np.testing.assert_allclose(s["sep"], [0.0, 0.0])
    np.testing.assert_allclose(s["broad"], [0.0, 0.0], atol=1e-6)
    assert s["punct"].isna().all()  # no . or , in the input
    top = strongest_heads(s, k=1)
    assert top["prev"] == [("1-1", 1.0)] and top["first"] == [("1-2", 1.0)] and "punct" not in top


def test_head_roles_and_atlas_summary(tmp_path):
    import pandas as pd

    from headatlas.core.look import atlas_summary, head_roles

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
    assert summary["pande roles (FDR)"] == {"delimiter": 2, "local": 1}
    assert summary["best relation beating its baseline"] == {"nsubj": 1, "amod": 1}


def test_look_on_a_tiny_model(tmp_path, tiny_models, capsys):
    model = tiny_models["bert"]
    out = tmp_path / "look.png"
    argv = ["look", str(model), "the cat sat on the mat .", "--out", str(out), "--results", str(tmp_path / "r")]
    assert main([*argv, "--config", "", "--tsv", str(tmp_path / "s.tsv")]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and out.with_suffix(".svg").is_file() and (tmp_path / "s.tsv").is_file()
    assert "strongest heads per pattern" in text and "prev" in text and "no atlas for" in text
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
    assert "no atlas at" in capsys.readouterr().err
    _atlas_tsv(tmp_path / "atlas" / "m" / "atlas.tsv")
    assert main(["atlas", "m", "--results", str(tmp_path), "--heads"]) == 0
    text = capsys.readouterr().out
    assert "pande roles (FDR): delimiter 2, local 1" in text and "2-2    clark:broad pande:delimiter" in text
