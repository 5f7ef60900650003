"""The per-layer HDF5 attention store: writer, reader, shards, atomicity, word-level maps."""

from __future__ import annotations

import json
import os

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
    out = write_store(
        tmp_path / "store", tokenized, maps, ids, order=[3, 0, 4, 2, 1], meta={"model": "m", "corpus": "c"}
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "layer_00.h5",
        "layer_01.h5",
        "manifest.json",
        "meta.json",
        "tokens.h5",
    ]
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
            for k in range(len(tokenized)):
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
    a = write_store(
        tmp_path / "shard0",
        tokenized[:cut],
        [m[:cut] for m in maps],
        ids[:cut],
        meta={"model": "m", "shard": 0, "n_shards": 2},
    )
    b = write_store(
        tmp_path / "shard1",
        tokenized[cut:],
        [m[cut:] for m in maps],
        ids[cut:],
        meta={"model": "m", "shard": 1, "n_shards": 2},
    )
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
    with pytest.raises(RuntimeError, match=r"maps missing for layer 2, sequence 0; layer 2, sequence 1"):
        with AttentionWriter(out, tokenized, ids, N_LAYERS, N_HEADS) as w:
            for k in range(len(tokenized)):
                w.write(k, 0, maps[0][k])  # layer 1 never written
    assert not out.exists()
    assert list((tmp_path / "results").iterdir()) == []


def test_writer_rejects_wrong_block_shape(tmp_path, corpus):
    tokenized, maps, ids = corpus
    with pytest.raises(ValueError, match=r"sequence 0, layer 1: block shape"):
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


# --- manifest, value checks, index rule, shards, chunks, empty stores (issue 11, 12) ------------


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path, corpus):
    from headatlas.core.store import LAYOUT_VERSION, file_checksum

    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    man = json.loads((out / "manifest.json").read_text())
    assert man["layout_version"] == LAYOUT_VERSION and man["checksum"] == "sha256"
    assert sorted(man["files"]) == ["layer_00.h5", "layer_01.h5", "meta.json", "tokens.h5"]
    for name, entry in man["files"].items():
        assert entry["size"] == (out / name).stat().st_size
        assert entry["sha256"] == file_checksum(out / name)
    assert man["n_sequences"] == 5 and man["n_tokens"] == sum(len(t) for t in tokenized)
    assert man["layers"]["layer_01.h5"] == {
        "n_sequences": 5,
        "n_cells": sum(len(t) ** 2 for t in tokenized),
        "n_heads": N_HEADS,
    }


def test_old_or_foreign_layout_is_rejected_with_the_rebuild_advice(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    man = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(dict(man, layout_version=99)))
    with pytest.raises(
        StoreError, match=r"manifest.json: store layout version 99.*delete the directory and rerun snakemake"
    ):
        AttentionStore(out)
    (out / "manifest.json").unlink()  # a store from before the manifest
    with pytest.raises(StoreError, match=r"manifest.json: missing.*layout version 1.*rerun snakemake"):
        AttentionStore(out)


def _bad_store(tmp_path, corpus, layer, k, head, row, value, storage_dtype="float32"):
    tokenized, maps, ids = corpus
    maps = [[m.copy() for m in per_layer] for per_layer in maps]
    maps[layer][k][head, row] = value
    return write_store(tmp_path / "bad", tokenized, maps, ids, storage_dtype=storage_dtype)


@pytest.mark.parametrize(
    "value, what", [(0.0, "row sums to 0"), (np.nan, "value nan"), (-0.25, "value -0.25"), (2.0, "value 2 outside")]
)
def test_every_read_checks_values_and_names_file_head_record(tmp_path, corpus, value, what):
    out = _bad_store(tmp_path, corpus, layer=1, k=2, head=2, row=1, value=value)
    # the file keeps its own 0-based name; the head is named 1-based (layer index 1, head index 2: head 2-3)
    where = rf"layer_01.h5: invalid attention map at head 2-3, sequence 2 \(record rec-2\), query row 1: {what}"
    with AttentionStore(out) as st:
        st.maps(1, 1), st.maps(0, 2), st.maps(1, 2, heads=0)  # other sequences, layers and heads are fine
        for read in (
            lambda: st.maps(1, 2),
            lambda: st.maps(1, 2, heads=2),
            lambda: st.head(1, 2),
            lambda: st.head_maps(1, 2),
            lambda: st.layer_maps(1),
            lambda: st.layer_maps(1, 2, 3),
            lambda: st.layer_cells(1, 0, 5),
            lambda: st.word_maps(1, 2),
        ):
            with pytest.raises(StoreError, match=where):
                read()
    with AttentionStore(out, check_values=False) as st:
        assert st.maps(1, 2).shape == (N_HEADS, 3, 3)


def test_store_errors_name_the_head_1_based_and_the_file_by_its_own_name(tmp_path, corpus):
    """docs/usage.md "Conventions": a corrupted map at layer index 1, head index 2 is head 2-3 in every message;
    the layer file keeps its own name (layer_01.h5)."""
    from headatlas.core.store import verify_store

    out = _bad_store(tmp_path, corpus, layer=1, k=2, head=2, row=1, value=0.0)
    with AttentionStore(out) as st, pytest.raises(StoreError) as err:
        st.head(1, 2)
    msg = str(err.value).split(str(out))[1]  # not the temporary directory's name
    assert msg.startswith("/layer_01.h5: invalid attention map at head 2-3, sequence 2 (record rec-2), query row 1")
    assert "1-2" not in msg and "layer 1" not in msg
    (fault,) = verify_store(out)
    assert fault.startswith(f"{layer_file(out, 1)}: head 2-3, sequence 2 (record rec-2), query row 1: row sums to 0")


def test_checked_maps_are_not_checked_again_but_unchecked_ones_are(tmp_path, corpus, monkeypatch):
    from headatlas.core import store as store_mod

    calls = []
    orig = store_mod.map_faults
    monkeypatch.setattr(
        store_mod, "map_faults", lambda cells, *a, **k: calls.append(cells.shape) or orig(cells, *a, **k)
    )
    out = _bad_store(tmp_path, corpus, layer=1, k=2, head=2, row=1, value=np.nan)
    with AttentionStore(out) as st:
        st.layer_cells(1, 0, 2)
        st.maps(1, 1), st.maps(1, 0, heads=0), st.head_maps(0, 1)  # sequences 0-1 of layer 1 already checked
        assert calls == [(N_HEADS, sum(len(t) ** 2 for t in corpus[0][:2])), (sum(len(t) ** 2 for t in corpus[0]),)]
        st.head_maps(0, 1), st.maps(0, 4, heads=1)
        assert len(calls) == 2
        st.maps(1, 2, heads=1)  # head 1 of sequence 2 is fine ...
        assert len(calls) == 3
        for _ in range(2):  # ... head 2 is not, whichever read comes first, and stays so
            with pytest.raises(
                StoreError,
                match=r"layer_01.h5: invalid attention map at head 2-3, sequence 2 \(record rec-2\), query row 1: value nan",
            ):
                st.layer_cells(1, 1, 4)
            with pytest.raises(StoreError, match=r"head 2-3, sequence 2"):
                st.maps(1, 2, heads=2)
    with AttentionStore(out) as st:  # a new object checks again
        with pytest.raises(StoreError, match=r"head 2-3, sequence 2"):
            st.head(1, 2)


def test_row_sums_are_those_of_the_read_cells_and_come_from_the_check(tmp_path, corpus):
    from headatlas.core import store as store_mod

    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    for check in (True, False):
        with AttentionStore(out, check_values=check) as st:
            for layer, k0, k1 in ((1, 0, 5), (0, 2, 4), (1, 3, 3)):
                cells = st.layer_cells(layer, k0, k1)
                sums = st.row_sums(layer, k0, k1)
                assert np.array_equal(st.row_sums(layer, k0, k1, cells), sums)
                want = np.concatenate([m.sum(-1) for m in maps[layer][k0:k1]] + [np.zeros((N_HEADS, 0))], axis=1)
                assert sums.shape == want.shape and np.allclose(sums, want, atol=1e-6)
                if cells.size:
                    assert np.array_equal(sums, np.add.reduceat(cells, store_mod.row_starts(st.lengths[k0:k1]), axis=1))
    with AttentionStore(out) as st:
        st.layer_cells(1, 0, 5)
        assert st.row_sums(1, 0, 5) is st._sums[3]  # no second pass over the cells: the check's own sums
        assert st.row_sums(1, 0, 4) is not st._sums[3]  # another run: computed here


def test_row_sum_tolerance_depends_on_the_stored_precision(tmp_path, corpus):
    from headatlas.core.store import ROW_SUM_TOL

    tokenized, maps, ids = corpus
    row = maps[0][0][0, 0]
    off = row + np.array([5e-3, 0, 0, 0, 0], dtype=np.float32)  # sums to 1.005
    assert ROW_SUM_TOL["float32"] < 5e-3 < ROW_SUM_TOL["half"]
    with AttentionStore(_bad_store(tmp_path / "a", corpus, 0, 0, 0, 0, off)) as st:
        with pytest.raises(StoreError, match="row sums to 1.00"):
            st.maps(0, 0)
    with AttentionStore(_bad_store(tmp_path / "b", corpus, 0, 0, 0, 0, off, storage_dtype="float16")) as st:
        st.maps(0, 0)
    # float16 rounding of honest maps never trips the check (rows of up to 512 cells)
    rng = np.random.default_rng(3)
    from headatlas.core.store import map_faults

    for n in (3, 64, 512):
        a = rng.dirichlet(np.full(n, 0.05), size=(2, n)).astype(np.float16).astype(np.float32)
        assert map_faults(a.reshape(2, n * n), np.array([n]), ROW_SUM_TOL["half"]) == []


def test_map_faults_hand_computed():
    from headatlas.core.store import map_faults, row_starts

    assert row_starts(np.array([2, 1, 3])).tolist() == [0, 2, 4, 5, 8, 11]
    a = np.array([0.5, 0.5, 1.0, 0.0, 1.0]), np.array([1.0]), np.array([1, 0, 0, 0.2, 0.8, 0, 0, 0, 1.0])
    cells = np.concatenate([np.concatenate([x.reshape(-1) for x in (np.array([0.5, 0.5, 1.0, 0.0]), a[1], a[2])])])[
        None
    ]
    assert map_faults(cells, np.array([2, 1, 3]), 1e-3) == []
    cells[0, 5 + 3 : 5 + 6] = [0.2, 0.2, 0.2]  # sequence 2, row 1 sums to 0.6
    assert map_faults(cells, np.array([2, 1, 3]), 1e-3) == [(0, 2, 1, "row sums to 0.6, not 1 (tolerance 0.001)")]


def test_one_index_rule_everywhere(tmp_path, corpus):
    tokenized, maps, ids = corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    with AttentionStore(out) as st:
        for call in (
            lambda: st.maps(0, -1),
            lambda: st.maps(0, 5),
            lambda: st.tokens(-1),
            lambda: st.tokens(5),
            lambda: st.word_maps(0, -1),
            lambda: st.maps(-1, 0),
            lambda: st.maps(N_LAYERS, 0),
            lambda: st.head(0, -1),
            lambda: st.head(0, N_HEADS),
            lambda: st.maps(0, 0, heads=-1),
            lambda: st.maps(0, 0, heads=slice(-2, None)),
            lambda: st.layer_maps(0, 0, 6),
            lambda: st.layer_maps(0, -1),
            lambda: st.layer_maps(0, 3, 2),
            lambda: st.layer_cells(0, 4, 6),
            lambda: st.head_maps(N_LAYERS, 0),
        ):
            with pytest.raises(IndexError, match="outside 0..[0-9]+( \\(negative indices are not accepted\\))?"):
                call()
        for call in (
            lambda: st.maps(1.0, 0),
            lambda: st.maps(0, 1.0),
            lambda: st.tokens(True),
            lambda: st.layer_maps(0, 0, 2.5),
        ):
            with pytest.raises(TypeError, match="must be an integer"):
                call()
        assert st.maps(np.int64(1), np.int32(4)).shape == (N_HEADS, 4, 4)  # numpy integers are integers
        assert st.layer_maps(0, 5, 5) == [] and st.layer_maps(0, 2, None)[0].shape == (N_HEADS, 3, 3)


def _shards(tmp_path, data, n_shards=2, **meta):
    tokenized, maps, ids = data
    cuts = np.linspace(0, len(tokenized), n_shards + 1).astype(int)
    out = []
    for s in range(n_shards):
        a, b = cuts[s], cuts[s + 1]
        m = {"model": "m", "corpus": "c", "shard": s, "n_shards": n_shards}
        m.update({k: v[s] if isinstance(v, list) else v for k, v in meta.items()})
        out.append(
            write_store(tmp_path / f"shard{s}of{n_shards}", tokenized[a:b], [x[a:b] for x in maps], ids[a:b], meta=m)
        )
    return out


def test_shards_must_be_one_extraction_each_once_in_order(tmp_path, corpus):
    a, b = _shards(tmp_path, corpus)
    with AttentionStore([a, b]) as st:
        assert len(st) == 5 and st.shard_of.tolist() == [0, 0, 1, 1, 1]
    with pytest.raises(StoreError, match="shard 0 given twice"):
        AttentionStore([a, a])
    with pytest.raises(StoreError, match="shard 0 given after shard 1"):
        AttentionStore([b, a])
    other = _shards(tmp_path / "o", corpus, corpus=["c", "d"])
    with pytest.raises(StoreError, match="corpus 'd' differs"):
        AttentionStore(other)
    other = _shards(tmp_path / "m", corpus, model=["m", "x"])
    with pytest.raises(StoreError, match="model 'x' differs"):
        AttentionStore(other)
    tokenized, maps, ids = corpus
    plain = write_store(
        tmp_path / "plain",
        tokenized[:2],
        [x[:2] for x in maps],
        ids[:2],
        meta={"model": "m", "corpus": "c", "n_shards": 2},
    )
    with pytest.raises(StoreError, match="no shard index"):
        AttentionStore([plain, b])


def test_chunks_fit_the_budget_and_never_cross_shards(tmp_path, corpus):
    tokenized, maps, ids = corpus  # lengths 5, 9, 3, 7, 4 in shards [5, 9] and [3, 7, 4]
    with AttentionStore(_shards(tmp_path, corpus)) as st:
        assert st.chunks(10**9) == [(0, 2), (2, 5)]
        assert st.chunks(1) == [(k, k + 1) for k in range(5)]
        runs = st.chunks((9 + 49) * 4 * N_HEADS)
        assert runs == [(0, 1), (1, 2), (2, 4), (4, 5)]
        for layer in range(N_LAYERS):
            for k0, k1 in runs + [(0, 5), (1, 4)]:  # also runs across the shard boundary
                cells = st.layer_cells(layer, k0, k1)
                assert cells.dtype == np.float32
                want = np.concatenate([maps[layer][k].reshape(N_HEADS, -1) for k in range(k0, k1)], axis=1)
                np.testing.assert_array_equal(cells, want)


def test_empty_shards_are_valid_empty_stores(tmp_path, corpus):
    from headatlas.core.store import verify_store

    tokenized, maps, ids = corpus
    empty = write_store(tmp_path / "shard0of3", [], [[], []], [], meta={"model": "m", "shard": 0, "n_shards": 3})
    full = write_store(tmp_path / "shard1of3", tokenized, maps, ids, meta={"model": "m", "shard": 1, "n_shards": 3})
    empty2 = write_store(tmp_path / "shard2of3", [], [[], []], [], meta={"model": "m", "shard": 2, "n_shards": 3})
    assert verify_store(empty) == []
    with AttentionStore(empty) as st:
        assert len(st) == 0 and st.chunks(100) == [] and st.layer_maps(0) == []
        assert st.head(1, 2)[0].shape == (0,) and st.layer_cells(0, 0, 0).shape == (N_HEADS, 0)
    with AttentionStore([empty, full, empty2]) as st:
        assert len(st) == 5 and st.chunks(10**9) == [(0, 5)]
        np.testing.assert_array_equal(st.maps(1, 4), maps[1][4])
        np.testing.assert_array_equal(st.head(0, 1)[0][:25], maps[0][0][1].reshape(-1))


def test_writer_removes_temporaries_of_dead_jobs_only(tmp_path, corpus):
    import subprocess
    import sys

    tokenized, maps, ids = corpus
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = tmp_path / f"s.tmp{dead}"
    (stale / "sub").mkdir(parents=True)
    (stale / "layer_00.h5").write_bytes(b"half written")
    alive = tmp_path / f"s.tmp{os.getppid()}"
    alive.mkdir()
    unrelated = tmp_path / f"other.tmp{dead}"
    unrelated.mkdir()
    write_store(tmp_path / "s", tokenized, maps, ids)
    assert not stale.exists() and alive.exists() and unrelated.exists()


def test_verify_finds_changed_bytes_and_bad_values(tmp_path, corpus):
    from headatlas.core.store import verify_store

    tokenized, maps, ids = corpus
    good = write_store(tmp_path / "good", tokenized, maps, ids)
    assert verify_store(good) == []
    bad = _bad_store(tmp_path, corpus, layer=0, k=3, head=1, row=0, value=0.0)
    man = json.loads((bad / "manifest.json").read_text())
    faults = verify_store(bad)
    assert (
        len(faults) == 1 and "layer_00.h5: head 1-2, sequence 3 (record rec-3), query row 0: row sums to 0" in faults[0]
    )
    with open(bad / "meta.json", "r+b") as fh:  # same size, other bytes
        fh.seek(2)
        fh.write(b"X")
    assert (bad / "meta.json").stat().st_size == man["files"]["meta.json"]["size"]
    faults = verify_store(bad)
    assert any("meta.json: sha256 checksum differs" in f for f in faults) and len(faults) == 2


# --- lower-triangle storage of causal maps (issue 13) ------------------------------------------


def causal_maps(rng, n: int, heads: int = N_HEADS) -> np.ndarray:
    a = np.tril(rng.random((heads, n, n)).astype(np.float32) + 1e-3)
    return a / a.sum(-1, keepdims=True)


@pytest.fixture
def causal_corpus(corpus):
    tokenized, _, ids = corpus
    rng = np.random.default_rng(1)
    maps = [[causal_maps(rng, len(t)) for t in tokenized] for _ in range(N_LAYERS)]
    return tokenized, maps, ids


def test_lower_cells_hand_computed():
    from headatlas.core.store import decode_cells, encode_cells, lower_cells, stored_cells

    # n=2: (0,0)=0, (1,0)=2, (1,1)=3; n=3 after 4 cells: (0,0)=4, (1,0)=7, (1,1)=8, (2,0..2)=10, 11, 12
    assert lower_cells(np.array([2, 3])).tolist() == [0, 2, 3, 4, 7, 8, 10, 11, 12]
    assert stored_cells(np.array([2, 3]), "lower").tolist() == [3, 6]
    cells = np.zeros((1, 13), dtype=np.float32)
    cells[0, [0, 2, 3, 4, 7, 8, 10, 11, 12]] = np.arange(1, 10)
    stored = encode_cells(cells, np.array([2, 3]), "lower")
    assert stored.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert np.array_equal(decode_cells(stored, np.array([2, 3]), "lower"), cells)
    cells[0, 1] = 0.5  # above the diagonal of the first map
    with pytest.raises(ValueError, match=r"above the diagonal \(1 nonzero cells\).*is the model causal"):
        encode_cells(cells, np.array([2, 3]), "lower", "x")


def write_lower(out, tokenized, maps, ids, storage_dtype="float32"):
    with AttentionWriter(
        out, tokenized, ids, N_LAYERS, N_HEADS, storage_dtype, {"model": "m"}, map_layout="lower"
    ) as w:
        for k in range(len(tokenized)):
            for layer in range(N_LAYERS):
                w.write(k, layer, maps[layer][k])
    return out


@pytest.mark.parametrize("storage_dtype", ["float32", "float16"])
def test_lower_triangle_store_reads_back_the_full_maps_exactly(tmp_path, causal_corpus, storage_dtype):
    from headatlas.core.store import LAYOUT_VERSION, describe_store, verify_store

    tokenized, maps, ids = causal_corpus
    dense = write_store(tmp_path / "dense", tokenized, maps, ids, storage_dtype)
    lower = write_lower(tmp_path / "lower", tokenized, maps, ids, storage_dtype)
    man = json.loads((lower / "manifest.json").read_text())
    assert man["layout_version"] == LAYOUT_VERSION == 3 and man["map_layout"] == "lower"
    n = np.array([len(t) for t in tokenized])
    assert man["layers"]["layer_00.h5"]["n_cells"] == int((n * (n + 1) // 2).sum())
    with h5py.File(layer_file(lower, 0)) as f:
        assert f["attn"].shape == (N_HEADS, int((n * (n + 1) // 2).sum()))
    assert verify_store(lower) == []
    assert describe_store([lower])["map_layout"] == "lower"
    with AttentionStore(dense) as a, AttentionStore(lower) as b:
        assert np.array_equal(a.cell_offsets, b.cell_offsets)  # the public offsets are those of full maps
        assert a.chunks(500) == b.chunks(500)
        for layer in range(N_LAYERS):
            want = maps[layer]
            got = b.layer_maps(layer)
            for k in range(len(tokenized)):
                exp = want[k].astype(storage_dtype).astype(np.float32)
                assert np.array_equal(got[k], exp) and np.array_equal(b.maps(layer, k), exp)
                assert np.array_equal(b.maps(layer, k, heads=1), exp[1])
            assert np.array_equal(a.layer_cells(layer, 1, 4), b.layer_cells(layer, 1, 4))
            assert np.array_equal(a.row_sums(layer, 0, 5), b.row_sums(layer, 0, 5))
            flat, off = b.head(layer, 2)
            assert np.array_equal(flat, a.head(layer, 2)[0]) and np.array_equal(off, a.cell_offsets)
            for x, y in zip(a.head_maps(layer, 0), b.head_maps(layer, 0)):
                assert np.array_equal(x, y)

    def size(d):
        with h5py.File(layer_file(d, 0)) as f:
            return f["attn"].id.get_storage_size()

    assert size(lower) == size(dense) * int((n * (n + 1) // 2).sum()) // int((n * n).sum())


def test_lower_triangle_writer_refuses_maps_that_look_ahead(tmp_path, corpus):
    tokenized, maps, ids = corpus  # full (encoder) maps
    with pytest.raises(ValueError, match="above the diagonal"):
        write_lower(tmp_path / "s", tokenized, maps, ids)
    assert not (tmp_path / "s").exists() and not list(tmp_path.iterdir())


def test_layout_2_store_is_read_as_full_maps(tmp_path, causal_corpus):
    """A store written before the lower-triangle layout (layout 2: full maps, no map_layout key) reads as it is."""
    tokenized, maps, ids = causal_corpus
    out = write_store(tmp_path / "s", tokenized, maps, ids)
    man = json.loads((out / "manifest.json").read_text())
    del man["map_layout"]
    (out / "manifest.json").write_text(json.dumps(dict(man, layout_version=2)))
    with AttentionStore(out) as st:
        assert st.map_layout == "full"
        for k in range(len(tokenized)):
            assert np.array_equal(st.maps(1, k), maps[1][k])


def test_large_representations_stored_compressed_and_exact(tmp_path):
    """Per-head vectors and hidden states of 1 MiB or more are gzip-compressed in chunks (lossless), written window
    by window in any order as extraction writes them, and read back bit for bit."""
    rng = np.random.default_rng(0)
    n, d, dim = 600, 128, 512  # head_vectors 600 x 3 x 128 and hidden 600 x 512 float32: 0.9 and 1.2 MB
    tokenized = [make_tokenized(4 + k % 5, k) for k in range(n)]
    hv = rng.standard_normal((N_LAYERS, n, N_HEADS, d)).astype(np.float32)
    hidden = rng.standard_normal((N_LAYERS, n, dim)).astype(np.float32)
    out = tmp_path / "store"
    ids = [f"r{k}" for k in range(n)]
    with AttentionWriter(
        out, tokenized, ids, N_LAYERS, N_HEADS, meta={"model": "m"}, maps=False, rep_shapes=(d, dim)
    ) as w:
        # windows out of order, across chunk boundaries; the last ones of 7 rows, so most chunks come in pieces
        windows = [(500, n), (0, 100), (250, 500)] + [(a, min(a + 7, 250)) for a in range(100, 250, 7)]
        for start, stop in windows:
            for layer in range(N_LAYERS):
                w.write_reps(np.arange(start, stop), layer, hv[layer, start:stop], hidden[layer, start:stop])
    with h5py.File(layer_file(out, 1)) as f:
        assert f["hidden"].compression == "gzip" and f["hidden"].shuffle  # 1.2 MB
        assert f["head_vectors"].compression is None  # 0.9 MB: below the 1 MiB threshold, plain
        stored = f["hidden"].id.get_storage_size() + f["head_vectors"].id.get_storage_size()
    # each compressed chunk written once: no space of a rewritten chunk's first copy left in the file
    assert layer_file(out, 1).stat().st_size < stored + (64 << 10)
    with AttentionStore(out) as st:
        for layer in range(N_LAYERS):
            np.testing.assert_array_equal(st.head_vectors(layer), hv[layer])
            np.testing.assert_array_equal(st.hidden(layer), hidden[layer])
