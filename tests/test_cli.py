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
