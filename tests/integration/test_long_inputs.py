"""Long inputs (issue 23): Clark's surface statistics alone on analysis.clark_surface.long_corpora, and the detectors
at a long corpus's length (analysis.detectors.long), map-free, through the real rules on a tiny Llama."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import WIKI_TEST
from reference.detectors import other_occurrence as other_occurrence_reference
from snakemake.utils import validate

from headatlas.clark.reducers import SurfaceReducer, fused_plan
from headatlas.clark.surface import SurfaceSettings
from headatlas.core import config_checks
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP
from headatlas.detectors.analysis import run_detectors
from headatlas.detectors.reducers import other_occurrence
from headatlas.detectors.registry import REGISTRY
from headatlas.detectors.sequences import DetectorSettings, LongDetectorSettings, long_settings

LONG = 96  # the tiny Llama's "long" corpus (its positions: 256)


def _clark_section(**keys) -> dict:
    section = dict(keys)
    validate(section, "workflow/schemas/clark_surface.schema.yaml")
    return section


def test_long_corpora_get_the_surface_reducer_only():
    section = _clark_section(corpora=["wiki"], long_corpora=["wiki_8192"], smoothing=0.001)
    assert SurfaceSettings.pick(section).long_corpora == ("wiki_8192",)
    long = fused_plan(section, "wiki_8192")
    assert [r.name for r in long] == ["clark_surface"] and isinstance(long[0], SurfaceReducer)
    assert long[0].params() == {"smoothing": 0.001}  # the section's settings reach the plan
    assert [r.name for r in fused_plan(section, "wiki")] == ["clark_surface", "clark_js"]
    assert fused_plan(section, "ewt") == []
    assert _clark_section()["long_corpora"] == []  # off by default


def _config(**analysis) -> dict:
    return {
        "models": [{"name": "m", "source": {"path": "x"}}],
        "corpora": {"wiki": {}, "wiki_8192": {}},
        "analysis": analysis,
    }


@pytest.mark.parametrize(
    "analysis, needle",
    [
        ({"clark_surface": {"corpora": ["wiki"], "long_corpora": ["wiki", "wiki_8192"]}},
         r"analysis\.clark_surface\.long_corpora: \['wiki'\] also in analysis\.clark_surface\.corpora"),
        ({"clark_surface": {"long_corpora": ["nope"]}}, r"analysis\.clark_surface\.long_corpora: unknown corpus 'nope'"),
        ({"detectors": {"long": {"corpora": ["nope"]}}}, r"analysis\.detectors\.long\.corpora: unknown corpus 'nope'"),
    ],
)  # fmt: skip
def test_long_corpus_config_errors_name_the_key(analysis, needle):
    with pytest.raises(ValueError, match=needle):
        config_checks.check_config(_config(**analysis))
    config_checks.check_config(_config(clark_surface={"corpora": ["wiki"], "long_corpora": ["wiki_8192"]}))


@pytest.mark.parametrize("causal", [True, False])
def test_other_occurrence_equals_the_n_by_n_reference(causal):
    rng = np.random.default_rng(0)
    for _ in range(20):
        b, n = 3, int(rng.integers(1, 40))
        piece = rng.choice(np.array(list("abcdef")), size=(b, n)).astype(object)
        special = np.where(rng.random((b, n)) < 0.15, SPECIAL_SEP, SPECIAL_NONE)
        special[:, 0] = SPECIAL_BOS if causal else SPECIAL_CLS
        lengths = rng.integers(1, n + 1, size=b)
        got = other_occurrence(piece, special, lengths, causal)
        np.testing.assert_array_equal(got, other_occurrence_reference(piece, special, lengths, causal))


def test_long_settings():
    s = long_settings(DetectorSettings(), LongDetectorSettings(n_sequences=3, batch_size=2), 8192, 1)
    assert (s.length, s.repeat_length, s.n_sequences, s.batch_size) == (8192, 4095, 3, 2)
    assert s.seed == DetectorSettings().seed and s.bootstrap == DetectorSettings().bootstrap


def test_long_detectors_run_map_free(tiny_loaded, monkeypatch):
    """At a long corpus's length on a map-free model no [B, H, n, n] map exists: the eager feed would fail."""
    import dataclasses

    from headatlas.core import reduce
    from headatlas.core.corpora import wiki_long_segments

    class NoMaps(reduce.FusedFeed):
        def __init__(self, *a, **k):
            raise AssertionError("the eager feed (n x n maps) was opened")

    monkeypatch.setattr(reduce, "FusedFeed", NoMaps)
    spec, model, tok, config = tiny_loaded("llama")
    spec = dataclasses.replace(spec, max_length=LONG)
    records = wiki_long_segments(WIKI_TEST, 2, LONG, seed=0)
    t = run_detectors(
        spec, model, tok, config, {"w": records}, DetectorSettings(bootstrap=20), LongDetectorSettings(n_sequences=2)
    )
    inputs = t["inputs"]
    assert inputs["input"].value_counts().to_dict() == {"natural": 2, "random": 2, "repeated_token": 2, "repeated": 2}
    assert (inputs.loc[inputs["input"].isin(["random", "repeated_token"]), "length"] == LONG).all()
    assert inputs.loc[inputs["input"] == "natural", "length"].between(LONG - 8, LONG).all()
    assert (inputs.loc[inputs["input"] == "repeated", "length"] == 1 + 2 * ((LONG - 1) // 2)).all()  # BOS + m twice
    assert t["heads"]["n"].max() == 2


@pytest.mark.slow
def test_long_rules_end_to_end(tmp_path, tiny_models):
    """The real rules: a tiny Llama with a 96-token long corpus (and a BERT it does not cover): surface statistics
    only on it, the long detectors' tables under results/detectors/llama/long/wiki_long/, both map-free."""
    from conftest import dry_run, output_of, run_snakemake

    from integration.test_workflow import model_entry

    config = {
        "models": [model_entry(m, tiny_models[m]) for m in ("bert", "llama")],
        "corpora": {
            "wiki": {"kind": "wikitext", "path": str(WIKI_TEST), "n_segments": 4, "max_words": 30, "seed": 0,
                     "overflow": "truncate", "maps": "sample", "sample": 2},
            "wiki_long": {"kind": "wikitext_long", "path": str(WIKI_TEST), "n_segments": 3, "tokens": LONG, "seed": 0,
                          "maps": False, "reps": False, "models": ["llama"]},
        },
        "analysis": {
            "clark_surface": {"corpora": ["wiki"], "long_corpora": ["wiki_long"], "gradients": {"n_segments": 2},
                              "clustering": {"n_segments": 2, "permutations": 10}},
            "detectors": {"corpora": ["wiki"], "n_sequences": 3, "length": 24, "repeat_length": 8, "bootstrap": 20,
                          "long": {"corpora": ["wiki_long"], "n_sequences": 3}},
            "atlas": {"activate": False},
        },
    }  # fmt: skip
    _, jobs, _ = dry_run(tmp_path, config)
    on_long = {r for r, w in jobs if w.get("corpus") == "wiki_long"}
    assert on_long == {"prepare_corpus", "extract_attention", "clark_surface_stats", "clark_behaviour",
                       "clark_surface_figures", "detectors_long", "detectors_long_figure"}  # fmt: skip
    assert {w["model"] for r, w in jobs if r == "detectors_long"} == {"llama"}
    assert {(w["model"], w["corpus"]) for r, w in jobs if r == "clark_surface_stats"} == {
        ("bert", "wiki"),
        ("llama", "wiki"),
        ("llama", "wiki_long"),
    }

    base = "results/detectors/llama/long/wiki_long"
    proc = run_snakemake(
        tmp_path, config, f"{base}/heads.tsv", f"{base}/detectors.png", "results/clark/llama/wiki_long/behaviour.tsv",
        "results/clark/llama/wiki_long/fig2_surface.png",
    )  # fmt: skip
    assert proc.returncode == 0, output_of(proc)[-4000:]
    heads = pd.read_csv(tmp_path / base / "heads.tsv", sep="\t")
    assert len(heads) == 2 * 4 * len(REGISTRY) * 4  # layers x heads x detectors x input kinds
    inputs = pd.read_csv(tmp_path / base / "inputs.tsv", sep="\t")
    assert inputs["input"].value_counts().to_dict() == {"natural": 3, "random": 3, "repeated_token": 3, "repeated": 3}
    assert set(inputs.loc[inputs["input"].isin(["random", "repeated_token"]), "length"]) == {LONG}
    natural = inputs.loc[inputs["input"] == "natural", "length"]
    assert natural.between(LONG - 8, LONG).all()  # the long text cut to LONG tokens at a word boundary
    assert set(inputs.loc[inputs["input"] == "repeated", "length"]) == {LONG - 1}  # BOS + 47 tokens twice
    assert inputs.loc[inputs["input"] == "natural", "source"].str.startswith("wiki_long:").all()
    assert (tmp_path / base / "detectors.svg").exists()
    for log in ("logs/detectors_long/llama/wiki_long.log", "logs/extract_attention/llama/wiki_long/shard0of1.log"):
        assert "mapfree attention" in (tmp_path / log).read_text(), log
    surface = pd.read_csv(tmp_path / "results/clark/llama/wiki_long/surface.tsv", sep="\t")
    assert len(surface) == 2 * 4 and (surface["n_sequences"] == 3).all()
    assert not (tmp_path / "results/clark/llama/wiki_long/js_distance.tsv").exists()


def test_a_long_corpus_past_the_positions_fails_before_any_model_loads(tmp_path, tiny_models):
    from conftest import output_of, run_snakemake

    from integration.test_workflow import model_entry

    config = {
        "models": [model_entry("llama", tiny_models["llama"])],
        "corpora": {"wiki_long": {"kind": "wikitext_long", "path": str(WIKI_TEST), "n_segments": 2, "tokens": 300,
                                  "seed": 0, "maps": False, "reps": False}},
        "analysis": {"detectors": {"long": {"corpora": ["wiki_long"]}}, "atlas": {"activate": False}},
    }  # fmt: skip
    proc = run_snakemake(tmp_path, config, "--dry-run")
    text = output_of(proc)
    assert proc.returncode != 0 and "corpus 'wiki_long' has 300 tokens per input" in text, text[-3000:]
    assert "position limit 256" in text
