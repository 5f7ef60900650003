"""Fault injection on real stores written by the real extraction of a tiny BERT: corrupt,
truncated, empty and deleted files, a corrupt token table, a kill during the write. Each ends
in a clear error naming the file (and no analysis returns on corrupt maps) or in a clean
recompute by the DAG."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO

from headatlas.core.extract import ExtractSettings, extract
from headatlas.core.store import AttentionStore, StoreError, layer_file, store_problem, verify_store


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_loaded, ewt_records):
    """A real store of the tiny BERT on 10 EWT sentences (copied by each test)."""
    spec, model, tokenizer, config = tiny_loaded("bert")
    out = tmp_path_factory.mktemp("faults") / "shard0of1"
    extract(ewt_records[:10], spec, model, tokenizer, config, out, meta={"corpus": "ewt", "shard": 0, "n_shards": 1})
    assert verify_store(out) == []
    return out


@pytest.fixture
def store_dir(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "shard0of1")


def scribble(path, offset: int, n: int, seed: int = 0) -> None:
    """Overwrite n bytes at ``offset`` with random ones (the file keeps its size)."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(np.random.default_rng(seed).bytes(n))
    assert path.stat().st_size == size


def attn_offset(path) -> int:
    with h5py.File(path, "r") as f:
        return f["attn"].id.get_offset()


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    return subprocess.run(
        [sys.executable, "-m", "headatlas", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_random_bytes_in_the_maps_fail_every_reader_and_verify(store_dir, ewt_records):
    from reference.clark import js_distance_matrix, store_correctness
    from reference.sieves import score_store
    from reference.surface import surface_table

    from headatlas.pande.sieves import SieveSettings

    path = layer_file(store_dir, 1)
    scribble(path, attn_offset(path) + 4 * 1000, 64)
    assert store_problem(store_dir) is None  # same size: the cheap checks cannot see it ...
    named = r"layer_01.h5: invalid attention map at head 2-\d+, sequence \d+ \(record [^)]+\)"
    with AttentionStore(store_dir) as st:
        st.maps(0, 0)  # ... the other layer reads fine
        # ... but no analysis that reads these maps returns
        for analysis in (
            lambda: surface_table(st),
            lambda: js_distance_matrix(st),
            lambda: score_store(st, ewt_records, SieveSettings()),
            lambda: store_correctness(st, ewt_records),
            lambda: [st.head(1, h) for h in range(st.n_heads)],
        ):
            with pytest.raises(StoreError, match=named):
                analysis()
    faults = verify_store(store_dir)
    assert any("layer_01.h5: sha256 checksum differs" in f for f in faults)
    assert any(f.startswith(f"{path}: head 2-") for f in faults)
    proc = run_cli("store", "verify", str(store_dir))
    assert proc.returncode == 1 and "FAULT" in proc.stdout and "layer_01.h5: sha256 checksum differs" in proc.stdout


@pytest.mark.parametrize("damage", ["truncated", "zero-length", "deleted"])
def test_damaged_layer_file_fails_on_open_naming_it(store_dir, damage):
    path = layer_file(store_dir, 0)
    if damage == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    elif damage == "zero-length":
        os.truncate(path, 0)
    else:
        path.unlink()
    want = "missing" if damage == "deleted" else "the manifest says"
    with pytest.raises(StoreError, match=rf"{path}: .*{want}.*rerun snakemake"):
        AttentionStore(store_dir)
    assert str(path) in store_problem(store_dir)  # what makes the DAG rerun the extraction
    assert str(path) in verify_store(store_dir)[0]


@pytest.mark.parametrize("where", ["superblock", "offsets"])
def test_corrupt_token_table_fails_on_open(store_dir, where):
    path = store_dir / "tokens.h5"
    if where == "superblock":
        scribble(path, 0, 16)
    else:
        with h5py.File(path, "r") as f:
            offset = f["token_offsets"].id.get_offset()
        scribble(path, offset + 8, 16)
    with pytest.raises(StoreError, match=rf"{path}: sha256 checksum differs"):
        AttentionStore(store_dir)
    assert any(str(path) in f for f in verify_store(store_dir))
    proc = run_cli("store", str(store_dir))
    assert proc.returncode == 1 and str(path) in proc.stderr


KILLED_WRITER = """
import os, signal, sys
from headatlas.core.corpora import read_conllu, sentence_records
from headatlas.core.extract import ExtractSettings, extract
from headatlas.core.models import ModelSpec, load

spec = ModelSpec.from_config({"name": "bert", "source": {"path": sys.argv[1]}, "max_length": 64, "batch_size": 2})
model, tokenizer, config = load(spec, device="cpu")
calls = []
def kill_late(module, args, output):
    calls.append(1)
    if len(calls) == 4:  # after some windows went to the writer
        os.kill(os.getpid(), signal.SIGKILL)
model.register_forward_hook(kill_late)
extract(sentence_records(read_conllu(sys.argv[2]))[:10], spec, model, tokenizer, config, sys.argv[3], ExtractSettings(buffer_bytes=20_000))
"""


def test_kill_during_the_write_leaves_nothing_accepted_and_the_next_run_cleans_up(
    tmp_path, tiny_models, tiny_loaded, ewt_head_file, ewt_records
):
    out = tmp_path / "results" / "shard0of1"
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tiny_models["bert"]), str(ewt_head_file), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    left = list(out.parent.iterdir())
    assert len(left) == 1 and re.fullmatch(r"shard0of1\.tmp\d+", left[0].name) and (left[0] / "tokens.h5").exists()
    assert not out.exists() and store_problem(out) is None  # missing: Snakemake reruns the job
    with pytest.raises(StoreError, match="missing"):
        AttentionStore(out)
    spec, model, tokenizer, config = tiny_loaded("bert")
    extract(ewt_records[:10], spec, model, tokenizer, config, out, ExtractSettings(buffer_bytes=20_000))
    assert [p.name for p in out.parent.iterdir()] == ["shard0of1"]  # the killed job's temporary is gone
    assert verify_store(out) == []


def test_more_shards_than_records_gives_valid_empty_stores(tmp_path, tiny_loaded, ewt_records):
    from headatlas.core.extract import shard_slice
    from headatlas.core.models import ModelError

    spec, model, tokenizer, config = tiny_loaded("bert")
    records = ewt_records[:2]
    dirs = []
    for s in range(4):
        part = shard_slice(len(records), s, 4)
        d = tmp_path / f"shard{s}of4"
        counts = extract(
            records[part],
            spec,
            model,
            tokenizer,
            config,
            d,
            first_index=part.start,
            meta={"corpus": "ewt", "shard": s, "n_shards": 4},
        )
        assert counts["sequences"] == part.stop - part.start
        dirs.append(d)
    with AttentionStore(dirs) as st, AttentionStore(dirs[0]) as empty:
        assert len(st) == 2 and st.record_index.tolist() == [0, 1] and len(empty) == 0
        assert st.head_vectors(1).shape[0] == 2 and empty.head_vectors(1).shape[0] == 0
    too_long = [r for r in ewt_records if len(r.words) > 20][:2]
    with pytest.raises(ModelError, match="every record is longer than max_length 8"):
        extract(
            too_long, spec.__class__(**{**spec.__dict__, "max_length": 8}), model, tokenizer, config, tmp_path / "x"
        )


@pytest.mark.slow
def test_dag_reruns_the_extraction_of_a_truncated_store(tmp_path, tiny_models):
    from conftest import job_stats, output_of, run_snakemake

    from integration.test_workflow import tiny_config

    cfg = tiny_config(tiny_models, models=("bert",))
    del cfg["corpora"]["ewt"]
    target = "results/attention/bert/wiki/shard0of1"
    proc = run_snakemake(tmp_path, cfg, target)
    assert proc.returncode == 0, output_of(proc)[-3000:]
    dry = run_snakemake(tmp_path, cfg, "--dry-run", target)
    assert "Nothing to be done" in output_of(dry), output_of(dry)[-3000:]
    path = layer_file(tmp_path / target, 1)
    os.truncate(path, 100)
    dry = run_snakemake(tmp_path, cfg, "--dry-run", target)
    text = output_of(dry)
    assert dry.returncode == 0 and job_stats(dry.stdout) == {"extract_attention": 1}, text[-3000:]
    assert f"damaged attention store, its extraction will rerun: {target}/layer_01.h5: 100 bytes" in text


def test_random_bytes_in_the_representations_fail_their_readers(store_dir):
    path = layer_file(store_dir, 0)
    with h5py.File(path, "r") as f:
        offset = f["head_vectors"].id.get_offset()
    scribble(path, offset + 40, 8)
    with AttentionStore(store_dir) as st:
        st.hidden(0), st.head_vectors(1)
        with pytest.raises(StoreError, match=rf"{path}: head_vectors differ from their sha256"):
            st.head_vectors(0)
    assert any("layer_00.h5: sha256 checksum differs" in f for f in verify_store(store_dir))


def test_extraction_refuses_maps_that_are_not_distributions(tmp_path, tiny_loaded, ewt_records):
    from headatlas.core.models import ModelError

    spec, model, tokenizer, config = tiny_loaded("bert")

    def zero_row(module, args, output):
        # layer index 1, head index 2 (head 2-3), query row 3 of the batch's first sequence
        output.attentions[1][0, 2, 3, :] = 0.0

    handle = model.register_forward_hook(zero_row)
    try:
        with pytest.raises(
            ModelError, match=r"model 'bert': head 2-3, record .+, query row 3: attention row sums to 0"
        ):
            extract(ewt_records[:4], spec, model, tokenizer, config, tmp_path / "out")
    finally:
        handle.remove()
    assert list(tmp_path.iterdir()) == []
