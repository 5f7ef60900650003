"""Fault injection on the files rules hand to each other (docs/integrity.md): random bytes in a fused result and
in a Pande score file, a lost tokenizer, a model named '..', a cut Pande table, a truncated gzip corpus, an
incomplete set of shards, a reordered config, a changed map sample, and a checkout that holds a finished run."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO
from unit.test_fused import reducers, run_extract

from headatlas.core.integrity import IntegrityError, damaged, file_problem
from headatlas.core.io import atomic_path
from headatlas.core.reduce import load_reduced
from headatlas.core.reducer import ReduceError
from headatlas.core.store import StoreError, run_faults, store_dirs, store_problem
from integration.test_faults import scribble


@pytest.fixture(scope="module")
def fused_store(tmp_path_factory, tiny_loaded, ewt_records):
    out = tmp_path_factory.mktemp("fused") / "shard0of1"
    run_extract(tiny_loaded("bert"), ewt_records[:12], out, fused=True, sample=[0, 3])
    return out


def test_random_bytes_in_a_reduced_result_fail_its_reader_and_the_dag_check(fused_store, tmp_path):
    d = shutil.copytree(fused_store, tmp_path / "shard0of1")
    surface = next(r for r in reducers() if r.name == "clark_surface")
    load_reduced(d, surface)
    path = d / "reduced" / "clark_surface.h5"
    scribble(path, path.stat().st_size // 2, 64)
    with pytest.raises(ReduceError, match=r"reduced/clark_surface.h5: sha256 differs from .*manifest.json"):
        load_reduced(d, surface)
    assert "reduced/clark_surface.h5: sha256 differs" in store_problem(d)  # so the DAG check reruns it


def test_a_damaged_sample_store_is_a_store_problem(fused_store, tmp_path):
    d = shutil.copytree(fused_store, tmp_path / "shard0of1")
    assert store_problem(d) is None
    (d / "sample" / "layer_01.h5").write_bytes(b"x")
    assert "sample/layer_01.h5: 1 bytes" in store_problem(d)


def test_random_bytes_in_a_score_file_fail_its_reader(tmp_path, monkeypatch):
    from headatlas.pande.analysis import load_scores, save_scores

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "results" / "pande" / "m" / "scores" / "c.h5"
    rng = np.random.default_rng(0)
    result = {
        "scores": rng.random((50, 2, 3, 4)), "pair_counts": np.ones((50, 2), int), "is_pair": np.zeros(50, bool),
        "record_id": [f"r{i}" for i in range(50)], "roles": list("abcd"), "relations": ["x"], "notes": {},
    }  # fmt: skip
    save_scores(path, result, {})
    assert load_scores(path)["scores"].shape == (50, 2, 3, 4)
    scribble(path, path.stat().st_size // 2, 32)
    with pytest.raises(IntegrityError, match=r"c.h5: sha256 differs from c.h5.sha256 .*delete .*c.h5 and rerun"):
        load_scores(path)
    assert [p for p, _ in damaged("results")] == [path.relative_to(tmp_path)]


def test_a_model_directory_without_tokenizer_json_is_an_error_naming_it(tiny_models, tmp_path):
    from conftest import tiny_spec

    from headatlas.core.models import ModelError, load

    d = shutil.copytree(tiny_models["bert"], tmp_path / "bert")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match=rf"in {d} has 5 entries, the model's vocab_size is \d+: is tokenizer.json"):
        load(tiny_spec("bert", d), device="cpu")


def test_unk_share_above_the_limit_is_an_error(tiny_loaded, ewt_records):
    from headatlas.core.integrity import check_unk_share

    _, _, tokenizer, _ = tiny_loaded("bert")
    share = check_unk_share(ewt_records[:20], tokenizer, "bert", 0.05)
    assert 0 <= share < 0.05
    with pytest.raises(IntegrityError, match=r"bert: the tokenizer turns .* into '\[UNK\]'"):
        check_unk_share(ewt_records[:20], tokenizer, "bert", share / 2 if share else -1)


@pytest.mark.parametrize("name", [".", "..", "a/b", ".hidden"])
def test_names_that_climb_out_of_their_folder_are_refused(name, tmp_path):
    import jsonschema

    from headatlas.core.integrity import check_name, replace_dir

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(name, schema["definitions"]["name"])
    with pytest.raises(IntegrityError, match="not a plain file name"):
        check_name(name, "models[].name")
    # a writer that would replace results/models/finetuned/.. (all of results/models) removes nothing
    models = tmp_path / "results" / "models"
    (models / "finetuned").mkdir(parents=True)
    (models / "gguf" / "other").mkdir(parents=True)
    (tmp_path / "new").mkdir()
    if name == "..":  # ('.' vanishes in a Path: the config check above refuses it)
        with pytest.raises(IntegrityError, match="refusing to write or remove it"):
            replace_dir(tmp_path / "new", models / "finetuned" / name)
    assert (models / "gguf" / "other").is_dir() and (tmp_path / "new").is_dir()


def test_a_cut_pande_table_fails_the_atlas_naming_the_file(tmp_path, monkeypatch):
    from headatlas.atlas.analysis import build_atlas
    from headatlas.core.integrity import read_table

    monkeypatch.chdir(tmp_path)
    rows = [
        {"layer": la, "head": h, "role": r, "effect": 0.5, "significant_faithful": True, "significant_fdr": False}
        for la in range(2) for h in range(3) for r in ("local", "syntactic")
    ]  # fmt: skip
    path = tmp_path / "results" / "pande" / "m" / "heads.tsv"
    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, sep="\t", index=False)
    table = read_table(path)
    table.attrs["path"] = str(path)
    assert build_atlas("m", 2, 3, {"pande": table})["pande_local_effect"].notna().all()
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[: len(text) // 2]) + "\n")  # half the rows, cut by hand
    with pytest.raises(IntegrityError, match=r"heads.tsv: sha256 differs"):
        read_table(path)
    cut = pd.read_csv(path, sep="\t")
    cut.attrs["path"] = str(path)
    with pytest.raises(ValueError, match=r"heads.tsv: rows for 3 of the 2 x 3 heads .*incomplete"):
        build_atlas("m", 2, 3, {"pande": cut})
    with pytest.raises(ValueError, match=r"heads.tsv: missing column 'effect'"):
        build_atlas("m", 2, 3, {"pande": cut.drop(columns="effect").assign(**{"effect_": 1})})


def test_a_table_missing_columns_or_out_of_range_names_the_file(tmp_path):
    from headatlas.core.integrity import read_table

    path = tmp_path / "surface.tsv"
    with atomic_path(path) as tmp:
        pd.DataFrame({"layer": [0], "head": [0], "entropy": [-2.7e227], "cls_share": [0.5]}).to_csv(tmp, sep="\t")
    with pytest.raises(IntegrityError, match=r"surface.tsv: missing columns \['mean_distance'\]"):
        read_table(path, columns=["entropy", "mean_distance"])
    with pytest.raises(IntegrityError, match=r"surface.tsv: 1 values of entropy are not in \[0, inf\]"):
        read_table(path)
    from headatlas.clark.surface import SHARE_STATS
    from headatlas.core.integrity import SHARE_RANGE, check_table

    shares = pd.DataFrame({"cls": [0.2, 4e23], "entropy": [1.0, 2.0]})
    with pytest.raises(IntegrityError, match=r"x.tsv: 1 values of cls are not in \[0, 1.01\] \(first 4e\+23\)"):
        check_table("x.tsv", shares, ranges=dict.fromkeys(SHARE_STATS, SHARE_RANGE))


def test_a_truncated_gzip_corpus_names_the_file(tmp_path, ewt_records):
    from headatlas.core.data import CorpusError, load_records, write_records

    path = tmp_path / "c.jsonl.gz"
    write_records(ewt_records * 20, path)
    assert len(load_records(path)) == 20 * len(ewt_records)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=rf"{path}: truncated or corrupt gzip file after line \d+"):
        load_records(path)


def test_an_incomplete_set_of_shards_is_refused_by_reader_cli_and_verify(tmp_path, tiny_loaded, ewt_records):
    from headatlas.cli import main
    from headatlas.core.extract import ExtractSettings, extract
    from headatlas.core.store import AttentionStore

    spec, model, tokenizer, config = tiny_loaded("bert")
    corpus = tmp_path / "results" / "attention" / "bert" / "ewt"
    for s in range(3):
        extract(ewt_records[2 * s : 2 * s + 2], spec, model, tokenizer, config, corpus / f"shard{s}of3", ExtractSettings(overflow="skip"), first_index=2 * s, meta={"corpus": "ewt", "shard": s, "n_shards": 3})  # fmt: skip
    assert main(["store", "verify", str(tmp_path / "results")]) == 0
    shutil.rmtree(corpus / "shard1of3")
    with pytest.raises(StoreError, match=r"incomplete set of shards: shard1of3 missing"):
        store_dirs(corpus)
    with pytest.raises(StoreError, match=r"incomplete set of shards: shards \[1\] of 3"):
        AttentionStore([corpus / "shard0of3", corpus / "shard2of3"])
    assert main(["store", str(corpus)]) == 1
    assert any("incomplete set of shards" in f for f in run_faults(tmp_path / "results"))
    assert main(["store", "verify", str(tmp_path / "results")]) == 1


def test_verify_covers_sealed_files_of_the_run_directory(tmp_path):
    from headatlas.cli import main

    path = tmp_path / "results" / "clark" / "m" / "surface.tsv"
    with atomic_path(path) as tmp:
        tmp.write_text("layer\thead\n0\t0\n")
    assert main(["store", "verify", str(tmp_path / "results")]) == 0
    path.write_text("layer\thead\n0\t1\n")
    assert main(["store", "verify", str(tmp_path / "results")]) == 1
    assert file_problem(path).startswith(f"{path}: sha256 differs")


def test_the_tiny_config_never_reads_the_checkouts_results(tmp_path, monkeypatch):
    """A checkout that holds a finished run: results/probing/sentences.jsonl.gz exists there."""
    import tiny_workflow

    checkout = tmp_path / "checkout"
    (checkout / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", checkout / "config" / "config.yaml")
    for rel in ("results/probing/sentences.jsonl.gz", "results/corpora/ewt.jsonl.gz"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_bytes(b"not the tiny run's")
    (checkout / "resources").symlink_to(REPO / "resources")
    monkeypatch.setattr(tiny_workflow, "REPO", checkout)
    cfg = tiny_workflow.tiny_config({"tinybert": tmp_path / "bert"})
    paths = [p for spec in cfg["corpora"].values() for p in ([spec["path"]] if "path" in spec else spec["paths"])]
    assert not [p for p in paths if str(checkout / "results") in p]
    assert any(p.startswith("results/") for p in paths)  # built by the tiny run itself


# --- the workflow: planning ---------------------------------------------------------------------------------


def _reorder(value):
    """Every dict with its keys in reverse order (what a YAML tool that sorts keys may give)."""
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_models):
    """An up-to-date tiny run (BERT; ewt full maps, wiki a map sample of 4; Clark's surface and Pande)."""
    from conftest import output_of, run_snakemake

    from integration.test_workflow import tiny_config

    workdir = tmp_path_factory.mktemp("finished")
    cfg = tiny_config(tiny_models, models=("bert",))
    cfg["corpora"]["wiki"].update(maps="sample", sample=4)
    cfg["analysis"]["pande"] = {"corpora": ["ewt"]}
    proc = run_snakemake(workdir, cfg)
    assert proc.returncode == 0, output_of(proc)[-4000:]
    return workdir, cfg


@pytest.mark.slow
def test_the_same_config_in_another_key_order_plans_nothing(finished_run):
    from conftest import dry_run

    workdir, cfg = finished_run
    assert dry_run(workdir, cfg)[0] == {}
    stats, _, text = dry_run(workdir, _reorder(cfg))
    assert stats == {}, text[-3000:]


@pytest.mark.slow
def test_a_sample_change_plans_only_the_samples_jobs(finished_run):
    from conftest import dry_run

    workdir, cfg = finished_run
    changed = yaml.safe_load(yaml.safe_dump(cfg))
    changed["corpora"]["wiki"]["sample"] = 2
    stats, jobs, text = dry_run(workdir, changed)
    assert {w.get("corpus") for r, w in jobs if r == "extract_attention"} == {"wiki"}, text[-3000:]
    assert not {"prepare_corpus", "parse_corpus", "pande_scores", "clark_gradients"} & set(stats), stats


@pytest.mark.slow
def test_a_damaged_sealed_output_reruns_its_job(finished_run):
    from conftest import dry_run

    workdir, cfg = finished_run
    table = next((workdir / "results").rglob("surface.tsv"))
    good = table.read_bytes()
    table.write_bytes(good.replace(b"\t0.", b"\t9.", 1))
    try:
        stats, _, text = dry_run(workdir, cfg)
        assert "damaged output, its job will rerun" in text and stats.get("clark_surface_stats") == 1, text[-3000:]
    finally:
        table.write_bytes(good)


def test_a_model_named_dotdot_stops_the_workflow_before_any_job(tmp_path, tiny_models):
    from conftest import output_of, run_snakemake

    from integration.test_workflow import tiny_config

    cfg = tiny_config(tiny_models, models=("bert",))
    cfg["models"][0]["name"] = ".."
    proc = run_snakemake(tmp_path, cfg, "--dry-run")
    assert proc.returncode != 0 and "'..' does not match" in output_of(proc), output_of(proc)[-3000:]


@pytest.mark.parametrize(
    "name, bounds",
    [
        ("cls_share", (0.0, 1.0)),
        ("p_nonparam_adj", (0.0, 1.0)),
        ("rank_p", (0.0, 1.0)),
        ("syntax_best_accuracy", (0.0, 1.0)),
        ("mean_entropy", (0.0, np.inf)),
        ("circ_q_in_z", None),  # Q-composition z-scores, not q-values
        ("q", None),  # Pande's count of FDR-significant corpora
        ("ablation_sst2_classification_accuracy_effect", None),  # a difference of accuracies
        ("share_diff", None),
    ],
)
def test_value_ranges_by_name_part(name, bounds):
    from headatlas.core.integrity import value_range

    assert value_range(name) == bounds
