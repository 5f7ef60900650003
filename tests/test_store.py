"""The per-layer HDF5 attention store: writer, reader, shards, atomicity, word-level maps."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, TokenizedRecord
from headatlas.core.store import AttentionStore, AttentionWriter, StoreError, layer_file, word_level, word_units

N_LAYERS, N_HEADS = 2, 3


def make_tokenized(n: int, index: int, n_split: int = 1) -> TokenizedRecord:
    """[CLS] w0 ... [SEP] with the first word split into ``n_split`` pieces."""
    inner = n - 2
    word = [0] * n_split + list(range(1, inner - n_split + 1))
    assert len(word) == inner
    return TokenizedRecord(
        record_index=index,
        ids=tuple(range(100 + index, 100 + index + n)),
        pieces=("[CLS]",) + tuple(f"p{index}_{i}" for i in range(inner)) + ("[SEP]",),
        word=(-1,) + tuple(word) + (-1,),
        special=(SPECIAL_CLS,) + (SPECIAL_NONE,) * inner + (SPECIAL_SEP,),
        segment=(0,) * n,
        n_words=max(word) + 1,
        truncated=index % 2 == 1,
    )


def random_maps(rng, n: int, heads: int = N_HEADS, dtype=np.float32) -> np.ndarray:
    a = rng.random((heads, n, n)).astype(dtype) + 1e-3
    return a / a.sum(-1, keepdims=True)


@pytest.fixture
def corpus():
    rng = np.random.default_rng(0)
    lengths = [5, 9, 3, 7, 4]
    tokenized = [make_tokenized(n, i, n_split=2 if n > 3 else 1) for i, n in enumerate(lengths)]
    maps = [[random_maps(rng, n) for n in lengths] for _ in range(N_LAYERS)]  # maps[layer][k]
    ids = [f"rec-{i}" for i in range(len(lengths))]
    return tokenized, maps, ids


def write_store(out, tokenized, maps, ids, storage_dtype="float32", order=None, meta=None):
    order = range(len(tokenized)) if order is None else order
    with AttentionWriter(out, tokenized, ids, N_LAYERS, N_HEADS, storage_dtype, meta or {"model": "m"}) as w:
        for k in order:
            for layer in range(N_LAYERS):
                w.write(k, layer, maps[layer][k])
    return out


def test_round_trip(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "store", tokenized, maps, ids, order=[3, 0, 4, 2, 1], meta={"model": "m", "corpus": "c"})
    assert sorted(p.name for p in out.iterdir()) == ["layer_00.h5", "layer_01.h5", "manifest.json", "meta.json", "tokens.h5"]
    with AttentionStore(out) as st:
        assert len(st) == len(tokenized)
        assert (st.n_layers, st.n_heads) == (N_LAYERS, N_HEADS)
        assert st.lengths.tolist() == [len(t) for t in tokenized]
        assert st.record_id.tolist() == ids
        assert st.record_index.tolist() == [t.record_index for t in tokenized]
        assert st.n_words.tolist() == [t.n_words for t in tokenized]
        assert st.meta["model"] == "m" and st.meta["corpus"] == "c"
        assert st.meta["n_sequences"] == 5 and st.meta["storage_dtype"] == "float32"
        assert json.loads((out / "meta.json").read_text()) == st.meta
        for layer in range(N_LAYERS):
            for k, t in enumerate(tokenized):
                got = st.maps(layer, k)
                assert got.dtype == np.float32
                np.testing.assert_array_equal(got, maps[layer][k])
                np.testing.assert_array_equal(st.maps(layer, k, heads=1), maps[layer][k][1])
            for h in range(N_HEADS):
                flat, off = st.head(layer, h)
                assert off.tolist() == np.concatenate([[0], np.cumsum(st.lengths**2)]).tolist()
                assert flat.shape == (off[-1],)
                for k, n in enumerate(st.lengths):
                    np.testing.assert_array_equal(flat[off[k] : off[k + 1]].reshape(n, n), maps[layer][k][h])
                for k, m in enumerate(st.head_maps(layer, h)):
                    np.testing.assert_array_equal(m, maps[layer][k][h])
            all_maps = st.layer_maps(layer)
            assert len(all_maps) == 5
            for k, m in enumerate(all_maps):
                np.testing.assert_array_equal(m, maps[layer][k])
            part = st.layer_maps(layer, 1, 4)
            assert len(part) == 3
            for k, m in zip(range(1, 4), part):
                np.testing.assert_array_equal(m, maps[layer][k])
        for k, t in enumerate(tokenized):
            tt = st.tokens(k)
            assert tt["input_ids"].tolist() == list(t.ids)
            assert tt["piece"].tolist() == list(t.pieces)
            assert tt["word"].tolist() == list(t.word)
            assert tt["special"].tolist() == list(t.special)
            assert tt["segment"].tolist() == list(t.segment)
        with pytest.raises(IndexError):
            st.maps(N_LAYERS, 0)


def test_float16_storage(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "half", tokenized, maps, ids, storage_dtype="float16")
    with h5py.File(layer_file(out, 0), "r") as f:
        assert f["attn"].dtype == np.float16
        assert f["attn"].shape == (N_HEADS, sum(len(t) ** 2 for t in tokenized))
    with AttentionStore(out) as st:
        assert st.meta["storage_dtype"] == "float16"
        for layer in range(N_LAYERS):
            for k in range(len(st)):
                got = st.maps(layer, k)
                assert got.dtype == np.float32
                np.testing.assert_allclose(got, maps[layer][k], atol=1e-3)
                np.testing.assert_array_equal(got, maps[layer][k].astype(np.float16).astype(np.float32))


def test_shards_read_as_one_store(tmp_path, corpus):
    tokenized, maps, ids = corpus
    single = write_store(tmp_path / "all", tokenized, maps, ids)
    cut = 2
    a = write_store(tmp_path / "shard0", tokenized[:cut], [m[:cut] for m in maps], ids[:cut], meta={"model": "m", "shard": 0, "n_shards": 2})
    b = write_store(tmp_path / "shard1", tokenized[cut:], [m[cut:] for m in maps], ids[cut:], meta={"model": "m", "shard": 1, "n_shards": 2})
    with AttentionStore(single) as one, AttentionStore([a, b]) as two:
        assert len(two) == len(one) == 5
        assert two.lengths.tolist() == one.lengths.tolist()
        assert two.record_id.tolist() == one.record_id.tolist()
        for layer in range(N_LAYERS):
            for h in range(N_HEADS):
                f1, o1 = one.head(layer, h)
                f2, o2 = two.head(layer, h)
                np.testing.assert_array_equal(o1, o2)
                np.testing.assert_array_equal(f1, f2)
            for k in range(5):
                np.testing.assert_array_equal(two.maps(layer, k), maps[layer][k])
            across = two.layer_maps(layer, 1, 4)  # spans the shard boundary
            for k, m in zip(range(1, 4), across):
                np.testing.assert_array_equal(m, maps[layer][k])
        for k in range(5):
            for key, v in one.tokens(k).items():
                assert two.tokens(k)[key].tolist() == v.tolist()


def test_shards_must_agree(tmp_path, corpus):
    tokenized, maps, ids = corpus
    a = write_store(tmp_path / "a", tokenized[:2], [m[:2] for m in maps], ids[:2], meta={"model": "m"})
    b = write_store(tmp_path / "b", tokenized[2:], [m[2:] for m in maps], ids[2:], meta={"model": "other"})
    with pytest.raises(ValueError, match="model"):
        AttentionStore([a, b])
    with pytest.raises(StoreError, match="missing"):
        AttentionStore([a, tmp_path / "missing"])


def test_writer_error_leaves_nothing(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = tmp_path / "results" / "shard0of1"
    with pytest.raises(KeyError, match="boom"):
        with AttentionWriter(out, tokenized, ids, N_LAYERS, N_HEADS) as w:
            w.write(0, 0, maps[0][0])
            raise KeyError("boom")
    assert not out.exists()
    assert list((tmp_path / "results").iterdir()) == []  # no temporary directory either


def test_incomplete_writer_leaves_nothing(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = tmp_path / "results" / "shard0of1"
    with pytest.raises(RuntimeError, match="missing"):
        with AttentionWriter(out, tokenized, ids, N_LAYERS, N_HEADS) as w:
            for k in range(len(tokenized)):
                w.write(k, 0, maps[0][k])  # layer 1 never written
    assert not out.exists()
    assert list((tmp_path / "results").iterdir()) == []


def test_writer_rejects_wrong_block_shape(tmp_path, corpus):
    tokenized, maps, ids = corpus
    with pytest.raises(ValueError, match="shape"):
        with AttentionWriter(tmp_path / "x", tokenized, ids, N_LAYERS, N_HEADS) as w:
            w.write(0, 0, maps[0][1])
    assert not (tmp_path / "x").exists()


# --- word-level maps ----------------------------------------------------------------------------

# [CLS] w0 w0 w0 w1 [SEP]: word 0 split into three pieces
WORD = np.array([-1, 0, 0, 0, 1, -1])
SPECIAL = np.array([SPECIAL_CLS, 0, 0, 0, 0, SPECIAL_SEP])
A = np.array(
    [
        [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],
        [0.0, 0.2, 0.2, 0.2, 0.4, 0.0],
        [0.1, 0.0, 0.0, 0.3, 0.6, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        [0.25, 0.25, 0.25, 0.25, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.5, 0.5],
    ]
)


def test_word_units():
    unit, unit_word, unit_special = word_units(WORD, SPECIAL)
    assert unit.tolist() == [0, 1, 1, 1, 2, 3]
    assert unit_word.tolist() == [-1, 0, 1, -1]
    assert unit_special.tolist() == [SPECIAL_CLS, 0, 0, SPECIAL_SEP]


def test_word_level_hand_computed_mean():
    got, unit_word, unit_special = word_level(A[None], WORD, SPECIAL, "mean")
    expected = np.array(
        [
            [0.5, 0.3, 0.1, 0.1],  # to w0 = sum of its three columns
            [0.1 / 3, 0.9 / 3, 1.0 / 3, 1.0 / 3],  # from w0 = mean of its three rows
            [0.25, 0.75, 0.0, 0.0],
            [0.0, 0.0, 0.5, 0.5],
        ]
    )
    assert got.shape == (1, 4, 4)
    np.testing.assert_allclose(got[0], expected, atol=1e-12)
    assert unit_word.tolist() == [-1, 0, 1, -1] and unit_special.tolist() == [SPECIAL_CLS, 0, 0, SPECIAL_SEP]


def test_word_level_hand_computed_first():
    got, _, _ = word_level(A[None], WORD, SPECIAL, "first")
    expected = np.array(
        [
            [0.5, 0.3, 0.1, 0.1],
            [0.0, 0.6, 0.4, 0.0],  # from w0 = its first piece's row
            [0.25, 0.75, 0.0, 0.0],
            [0.0, 0.0, 0.5, 0.5],
        ]
    )
    np.testing.assert_allclose(got[0], expected, atol=1e-12)
    with pytest.raises(ValueError):
        word_level(A[None], WORD, SPECIAL, "last")


@pytest.mark.parametrize("mode", ["mean", "first"])
def test_word_rows_sum_to_one(mode):
    rng = np.random.default_rng(1)
    word = np.array([-1, 0, 1, 1, 2, 3, 3, 3, 4, -1, 5, 5, 6, -1])
    special = np.where(word < 0, SPECIAL_SEP, 0)
    special[0] = SPECIAL_CLS
    maps = random_maps(rng, len(word), heads=4, dtype=np.float64)
    got, unit_word, unit_special = word_level(maps, word, special, mode)
    assert got.shape == (4, 3 + 7, 3 + 7)
    assert unit_word.tolist() == [-1, 0, 1, 2, 3, 4, -1, 5, 6, -1]
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)


def test_store_word_maps(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    with AttentionStore(out) as st:
        t = st.tokens(1)
        got, unit_word, _ = st.word_maps(1, 1)
        ref, ref_word, _ = word_level(maps[1][1], np.array(tokenized[1].word), np.array(tokenized[1].special))
        np.testing.assert_allclose(got, ref, rtol=1e-6)
        assert unit_word.tolist() == ref_word.tolist()
        assert got.shape[1] == len(set(t["word"].tolist()) - {-1}) + 2
