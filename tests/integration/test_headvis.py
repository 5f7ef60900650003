"""headatlas export headvis: a run's atlas as HeadVis's static data/ tree, validated against HeadVis's data contract
(tests/headvis_schema.json, written from the docstrings of its data_pipeline.py)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pandas as pd
import pytest
from conftest import REPO
from unit.atlas.test_atlas_page import HOSTILE, _grid_atlas

from headatlas.atlas import headvis
from headatlas.cli import main
from headatlas.core.data import Record, write_records
from headatlas.core.store import AttentionStore

SCHEMA = json.loads((REPO / "tests" / "headvis_schema.json").read_text())


def _validator(part: str):
    return jsonschema.Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{part}"})


@pytest.fixture
def run_dir(tmp_path, tiny_loaded):
    """results/ of a run: the atlas of model m and its ewt_dev store (maps: sample, 3 of 4 records kept)."""
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.extract import ExtractSettings, extract

    words = [("the", "cat", "sat", "down"), HOSTILE[:4], ("we", "saw", "the", "big", "red", "bus"), ("a", "dog", "ran")]
    records = [Record(id=f"r{i}", words=w, segment=(0,) * len(w)) for i, w in enumerate(words)]
    results = tmp_path / "results"
    write_records(records, tmp_path / "corpus.jsonl.gz")
    spec, model, tokenizer, config = tiny_loaded("bert")
    store = results / "attention" / "m" / "ewt_dev" / "shard0of1"
    extract(records, spec, model, tokenizer, config, store, ExtractSettings(overflow="truncate", maps=False, reps=False), meta={"corpus": "ewt_dev", "shard": 0, "n_shards": 1}, reducers=[SurfaceReducer()], sample=[0, 1, 2], corpus_records=records)  # fmt: skip
    with AttentionStore(store) as st:
        shape = (st.n_layers, st.n_heads)
    atlas = _grid_atlas(*shape).assign(model="m", clark_self=0.25)
    atlas.loc[0, "det_prev"] = np.nan  # a head without a value
    (results / "atlas" / "m").mkdir(parents=True)
    atlas.to_csv(results / "atlas" / "m" / "atlas.tsv", sep="\t", index=False, float_format="%.6g")
    return results


def test_export_validates_against_the_headvis_contract_with_every_metric(run_dir, tmp_path, capsys):
    out = tmp_path / "hv"
    assert main(["export", "headvis", str(run_dir), str(out)]) == 0
    assert "HeadVis data:" in capsys.readouterr().out
    data = out / "data"
    config = json.loads((data / "config.json").read_text())
    scatter = json.loads((data / "scatter_data.json").read_text())
    _validator("config").validate(config)
    _validator("scatter").validate(scatter)
    atlas = pd.read_csv(run_dir / "atlas" / "m" / "atlas.tsv", sep="\t")
    numeric = [
        c
        for c in atlas.columns
        if c not in headvis.ID_COLUMNS and pd.api.types.is_numeric_dtype(atlas[c]) and atlas[c].dtype != bool
    ]
    assert set(numeric) <= set(config["metrics"]) and {
        "previous_token_score",
        "self_attention_score",
        "pattern_entropy",
    } <= set(config["metrics"])
    assert set(config["metric_descriptions"]) == set(config["metrics"])
    assert config["metric_descriptions"]["ablation_lm_loss_effect"].endswith("(nats per token)")
    assert len(scatter) == len(config["heads"]) == len(atlas) and config["model_name"] == "m"
    first = next(r for r in scatter if (r["layer"], r["head"]) == (0, 0))
    assert first["det_prev"] is None and first["previous_token_score"] is None  # no value: null, not 0
    row = next(r for r in scatter if (r["layer"], r["head"]) == (1, 2))
    want = atlas[(atlas["layer"] == 1) & (atlas["head"] == 2)].iloc[0]
    assert (
        row["clark_entropy"] == pytest.approx(want["clark_entropy"]) and row["pattern_entropy"] == row["clark_entropy"]
    )
    head = _validator("head")
    n_seq = 0
    for layer, h in config["heads"]:
        payload = json.loads((data / "heads" / config["head_data_pattern"].format(layer=layer, head=h)).read_text())
        head.validate(payload)
        assert set(payload["statistics"]) >= set(atlas.columns) - set(headvis.ID_COLUMNS)  # every atlas value, text too
        for s in payload["sequences"]:
            assert (
                len(s["attention_indices"]) == len(s["attention_values"])
                and max(s["attention_indices"]) < s["seq_len"] ** 2
            )
            assert len(s["tokens"]) == s["seq_len"]
        n_seq = len(payload["sequences"])
    assert n_seq == 3  # the sampled sequences
    assert (data / "server_config.json").read_text() == "{}"


def test_sparse_attention_and_max_activation_hand_computed():
    a = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.001, 0.2, 0.799]])
    idx, val = headvis.sparse_attention(a)
    assert idx == [0, 3, 4, 7, 8] and val == [1.0, 0.5, 0.5, 0.2, 0.799]  # 0.001 < 0.005 is dropped
    assert headvis.max_activation(a) == 0.2  # row 0, column 0 and the diagonal skipped
    assert headvis.intervals([0.1, 0.9, 0.5]) == [1, 7, 4]


def test_export_errors_name_what_is_missing(run_dir, tmp_path, capsys):
    assert main(["export", "headvis", str(tmp_path / "nothing"), str(tmp_path / "o")]) == 1
    assert "no atlas" in capsys.readouterr().err
    assert main(["export", "headvis", str(run_dir), str(tmp_path / "o"), "--model", "x"]) == 1
    assert "no atlas of model 'x' (atlases: m)" in capsys.readouterr().err
    assert not (tmp_path / "o" / "data").exists()
