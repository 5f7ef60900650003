"""Models larger than one device: the config keys device_map / max_memory / offload_folder split a model with
accelerate as transformers loads it, and the split model gives the unsplit model's tables; a model that does not fit
the memory it was given fails before any weight loads; a GPU job asks for the GPUs the model needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_spec
from unit.clark.test_gradients import lm_models  # noqa: F401  (the fixture)
from unit.core.test_mapfree import mapfree_reducers, max_diff

from headatlas.core.device import WEIGHT_SHARE, gpus_needed, input_device
from headatlas.core.extract import tokenize_records
from headatlas.core.models import (
    DTYPE_BYTES,
    ModelError,
    ModelSpec,
    check_fits,
    checkpoint_parameters,
    decoder_bos,
    job_gpus,
    load,
    model_kind,
    parameter_count,
)
from headatlas.core.reduce import fused_reduce

pytest.importorskip("accelerate")

# every layer on its own part: the embeddings and the odd layers offloaded to disk, the rest on the CPU
SPLITS = {
    "llama": lambda n: (
        {"embed_tokens": "disk", "norm": "cpu", "rotary_emb": "cpu"}
        | {f"layers.{i}": ("disk" if i % 2 else "cpu") for i in range(n)}
    ),
    "bert": lambda n: (
        {"embeddings": "disk", "pooler": "cpu"} | {f"encoder.layer.{i}": ("disk" if i % 2 else "cpu") for i in range(n)}
    ),
}


def tables(spec, model, tok, config, records, path):
    """The map-free reducers' results (position and detector statistics) of the fused extraction of ``records``."""
    kind = model_kind(config, spec)
    tokenized, _ = tokenize_records(records, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return fused_reduce(model, tokenized, mapfree_reducers(), 4, kind, records, pad, spec.name, path=path)


@pytest.mark.parametrize("name", ["llama", "bert"])
@pytest.mark.parametrize("path", ["mapfree", "eager"])
def test_split_by_the_config_key_gives_the_unsplit_tables(name, path, tiny_models, tiny_loaded, ewt_records, tmp_path):
    """A device_map from the model's config entry (embeddings and every other layer on disk, the rest on the CPU)
    through models.load: the fused reducers' tables equal the unsplit model's, map-free and from the eager maps."""
    spec, model, tok, config = tiny_loaded(name)
    split_map = SPLITS[name](config.num_hidden_layers)
    split_spec = tiny_spec(name, tiny_models[name], device_map=split_map, offload_folder=str(tmp_path / "offload"))
    split, _, _ = load(split_spec, device="cpu")
    assert split.hf_device_map == split_map
    assert next(split.get_input_embeddings().parameters()).device.type == "meta"  # its weights are on disk
    assert input_device(split) == torch.device("cpu")  # where the offloaded embeddings run
    recs = list(ewt_records[:8])
    got, want = tables(split_spec, split, tok, config, recs, path), tables(spec, model, tok, config, recs, path)
    assert len(got) == len(want) == 2
    assert max(max_diff(a, b) for a, b in zip(want, got)) < 1e-6


def test_sequential_map_with_a_memory_cap_offloads_to_disk(tiny_models, tiny_loaded, ewt_records, tmp_path):
    """device_map sequential with max_memory cpu below the model's size: accelerate puts what does not fit on disk,
    in this job's own subfolder of offload_folder; the tables are the unsplit model's."""
    spec, model, tok, config = tiny_loaded("llama")
    n = parameter_count(str(tiny_models["llama"]))
    folder = tmp_path / "offload"
    split_spec = tiny_spec(
        "llama", tiny_models["llama"], device_map="sequential", max_memory={"cpu": n * 3}, offload_folder=str(folder)
    )
    split, _, _ = load(split_spec, device="cpu")
    assert {"cpu", "disk"} <= set(split.hf_device_map.values())
    assert [p.name.startswith("llama-") for p in folder.iterdir()] == [True]
    recs = list(ewt_records[:6])
    got, want = (
        tables(split_spec, split, tok, config, recs, "mapfree"),
        tables(spec, model, tok, config, recs, "mapfree"),
    )
    assert max(max_diff(a, b) for a, b in zip(want, got)) < 1e-6


def test_too_small_a_memory_fails_before_loading(tiny_models, monkeypatch):
    """A tiny model given a 1 kB memory budget (max_memory cpu): an error naming the model, its size and the memory,
    raised before from_pretrained reads a weight."""
    from transformers import AutoModel

    def no_load(*a, **k):
        raise AssertionError("weights loaded before the fit check")

    monkeypatch.setattr(AutoModel, "from_pretrained", no_load)
    n = checkpoint_parameters(tiny_models["bert"])
    spec = tiny_spec("bert", tiny_models["bert"], device_map="auto", max_memory={"cpu": "1KB"})
    with pytest.raises(ModelError) as e:
        load(spec, device="cpu")
    msg = str(e.value)
    assert "model 'bert' does not fit" in msg
    assert f"{n:,} parameters x 4 bytes, float32" in msg and f"its weights are {n * 4 / 1e3:.1f} kB" in msg
    assert "more than 90% of 1.0 kB (max_memory cpu 1.0 kB)" in msg and "on cpu" in msg


def test_disk_in_the_map_needs_an_offload_folder(tiny_models):
    """A device_map that puts a module on disk without an offload_folder: an error naming both keys."""
    spec = tiny_spec("llama", tiny_models["llama"], device_map={"embed_tokens": "cpu", "layers": "disk", "norm": "cpu"})
    with pytest.raises(
        ModelError, match=r"models\[llama\]\.device_map puts layers on disk: set models\[llama\]\.offload_folder"
    ):
        load(spec, device="cpu")


def test_fit_check_against_gpus():
    """Llama-3-70B in bfloat16 (70.55e9 parameters, 141 GB): one 80 GB GPU is too small and the error says how many
    it needs; two 80 GB or four 40 GB GPUs with device_map auto hold it; a disk offload folder always does."""
    n, gb = 70_553_706_496, 10**9
    one = ModelSpec("llama70b", {"hub": "meta-llama/Meta-Llama-3-70B"}, dtype="bfloat16")
    with pytest.raises(ModelError, match=r"141\.1 GB .* 80\.0 GB \(1 GPU x 80\.0 GB\) on cuda; it needs 2 GPUs"):
        check_fits(one, n, "bfloat16", "cuda", gpus=[80 * gb])
    auto = ModelSpec("llama70b", one.source, dtype="bfloat16", device_map="auto")
    check_fits(auto, n, "bfloat16", "cuda", gpus=[80 * gb] * 2)
    check_fits(auto, n, "bfloat16", "cuda", gpus=[40 * gb] * 4)
    with pytest.raises(ModelError, match=r"120\.0 GB \(3 GPUs x 40\.0 GB\)"):
        check_fits(auto, n, "bfloat16", "cuda", gpus=[40 * gb] * 3)
    with pytest.raises(ModelError, match=r"282\.2 GB .* float32"):  # float32 doubles it
        check_fits(auto, n, "float32", "cuda", gpus=[80 * gb] * 2)
    capped = ModelSpec("llama70b", one.source, device_map="auto", max_memory={0: "60GB", 1: "60GB"})
    with pytest.raises(ModelError, match=r"120\.0 GB \(2 GPUs x 60\.0 GB\)"):
        check_fits(capped, n, "bfloat16", "cuda", gpus=[80 * gb] * 4)
    explicit = ModelSpec("llama70b", one.source, device_map={"embed_tokens": "cuda:0", "layers": "cuda:1", "norm": 1})
    with pytest.raises(ModelError, match=r"80\.0 GB \(2 GPUs x 40\.0 GB\)"):  # the GPUs the map names
        check_fits(explicit, n, "bfloat16", "cuda", gpus=[40 * gb] * 4)
    with_cpu = ModelSpec("llama70b", one.source, device_map="auto", max_memory={0: "70GB", "cpu": "100GB"})
    check_fits(with_cpu, n, "bfloat16", "cuda", gpus=[80 * gb], host=500 * gb)
    on_disk = ModelSpec("llama70b", one.source, device_map="auto", offload_folder="offload")
    check_fits(on_disk, n, "bfloat16", "cuda", gpus=[80 * gb])
    check_fits(one, n, "bfloat16", "cpu", host=200 * gb)
    with pytest.raises(ModelError, match=r"the host's RAM"):
        check_fits(one, n, "bfloat16", "cpu", host=128 * gb)


def test_gpus_asked_for():
    """A job asks for the model's gpus; else, with a device_map, for as many GPUs as its weights fill at WEIGHT_SHARE
    of gpu_memory_gb each; else for one."""
    assert WEIGHT_SHARE == 0.9
    weights = 70_553_706_496 * DTYPE_BYTES["bfloat16"]
    assert gpus_needed(weights, 80 * 10**9) == 2 and gpus_needed(weights, 40 * 10**9) == 4
    assert gpus_needed(1, 80 * 10**9) == 1
    src = {"path": "x"}
    assert job_gpus(ModelSpec("m", src, gpus=3), None, 80 * 10**9) == 3
    assert job_gpus(ModelSpec("m", src), None, 80 * 10**9) == 1


def test_gpus_from_the_checkpoint_size(tiny_models):
    """The derived count reads the parameter count from the checkpoint's safetensors headers (no weight loaded): it
    equals the model's own count, and a GPU of just under 1/0.9 of the weights' bytes per half needs 2."""
    from transformers import AutoModel

    loc = str(tiny_models["llama"])
    n = checkpoint_parameters(loc)
    model = AutoModel.from_pretrained(loc)
    assert n == sum(p.numel() for p in model.parameters())
    spec = ModelSpec("llama", {"path": loc}, device_map="auto")
    weights = n * 4
    assert job_gpus(spec, loc, int(weights / WEIGHT_SHARE) + 1) == 1
    assert job_gpus(spec, loc, int(weights / WEIGHT_SHARE / 2) + 1) == 2
    assert job_gpus(ModelSpec("llama", {"path": loc}), loc, 1) == 1  # no device_map: the model runs on one GPU


def test_input_device_follows_the_embeddings(tiny_loaded):
    """Inputs go where the embeddings run: their GPU; offloaded (cpu or disk), the first GPU of the map; an unsplit
    model's device."""
    _, model, _, _ = tiny_loaded("llama")
    assert input_device(model) == torch.device("cpu")
    try:
        model.hf_device_map = {"embed_tokens": 1, "layers": 0, "norm": 0}
        assert input_device(model) == torch.device("cuda:1")
        model.hf_device_map = {"embed_tokens": "disk", "layers": 0, "norm": "cpu"}
        assert input_device(model) == torch.device("cuda:0")
        model.hf_device_map = {"": "cpu"}
        assert input_device(model) == torch.device("cpu")
    finally:
        del model.hf_device_map


def test_workflow_asks_for_the_gpus_a_model_needs(tmp_path, tiny_models):
    """A dry run with the GPU switch: the model with gpus 3 (and an explicit map, GPU and cpu keys in max_memory)
    asks for 3; the one with a device_map and no gpus for as
    many GPUs of gpu_memory_gb as its checkpoint fills (2 here); the one without either for 1."""
    from integration.test_profiles import dry_run_gpu

    n = checkpoint_parameters(tiny_models["llama"])
    gb = n * 4 / WEIGHT_SHARE / 1.5 / 1e9  # its float32 weights fill 1.5 GPUs of this size
    models = [
        {
            "name": "gpu_model",
            "source": {"path": str(tmp_path / "a")},
            "gpus": 3,
            "device_map": {"embeddings": 0, "encoder": 1, "pooler": "cuda:2"},
            "max_memory": {0: "70GiB", 1: 75 * 10**9, "cpu": "100GB"},
        },
        {"name": "cpu_model", "source": {"path": str(tmp_path / "b")}, "device": "cpu", "gpus": 2},
        {"name": "auto_model", "source": {"path": str(tiny_models["llama"])}, "device_map": "auto"},
    ]
    got = dry_run_gpu(tmp_path, "--config", "gpu_jobs=True", f"gpu_memory_gb={gb}", models=models)
    assert got == {"gpu_model": {"3"}, "cpu_model": {"0"}, "auto_model": {"2"}}


def test_split_model_job_asks_slurm_for_its_gpus():
    """A job with gpu=2 (a model split over two GPUs) becomes `sbatch --gpus=2` and goes to the GPU partition of
    profiles/slurm-gpu; one asking for more GPUs than any partition has fits none."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    import logging

    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    from integration.test_profiles import PROFILES, FakeJob, load

    job = FakeJob(threads=4, gpu=2, gpu_model="a100", mem_mb=64000, runtime=600)
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": "", "workdir": "w"}
    assert "--gpus=a100:2" in get_submit_command(job, params) + set_gres_string(job)
    parts = read_partition_file(PROFILES / "slurm-gpu" / load("slurm-gpu")["slurm-partition-config"])
    log = logging.getLogger("test")
    assert get_best_partition(parts, FakeJob(gpu=2, mem_mb=64000, runtime=600), log) == "gpu"
    assert get_best_partition(parts, FakeJob(gpu=8, mem_mb=64000, runtime=600), log) is None


# a model with its LM head (tied to the word embeddings: both on the CPU), one layer on disk
LM_SPLITS = {
    "bert_mlm": {"bert.embeddings": "cpu", "bert.encoder.layer.0": "disk", "bert.encoder.layer.1": "cpu", "cls": "cpu"},
    "llama_lm": {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                 "model.rotary_emb": "cpu", "lm_head": "cpu"},
}  # fmt: skip


@pytest.mark.parametrize("name", ["bert_mlm", "llama_lm"])
def test_split_lm_model_gives_the_unsplit_gradient_table(name, lm_models, ewt_records, tmp_path):  # noqa: F811
    """Clark's gradient importance through a model with its LM head loaded split by the config key (a layer
    offloaded to disk): backpropagation through the offloaded layer gives the unsplit model's table."""
    from unit.clark.test_gradients import spec_of

    from headatlas.clark.gradients import gradient_table
    from headatlas.core.models import lm_head_model

    split_spec = spec_of(lm_models / name, device_map=LM_SPLITS[name], offload_folder=str(tmp_path))
    kind = "encoder" if name.startswith("bert") else "decoder"
    split, _ = lm_head_model(str(lm_models / name), kind, {}, split_spec)
    assert split.hf_device_map == LM_SPLITS[name]
    got = gradient_table(split_spec, ewt_records, overflow="truncate", n_segments=4, device="cpu")
    want = gradient_table(spec_of(lm_models / name), ewt_records, overflow="truncate", n_segments=4, device="cpu")
    assert (got["status"] == "ok").all()
    num = want.select_dtypes("number").columns
    np.testing.assert_allclose(got[num].to_numpy(float), want[num].to_numpy(float), rtol=1e-5, atol=1e-9)


def test_split_classifier_gives_the_unsplit_classification_ablation(tiny_models, tmp_path):
    """The classification ablation's classifier loads as every model-running rule does: split over the CPU and disk
    by its device_map, its losses and accuracy, intact and with a head zero-ablated, equal the unsplit model's."""
    from conftest import RESOURCES
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from headatlas.ablation.patch import replacement
    from headatlas.ablation.tasks import classification_evaluation
    from headatlas.core.models import resolve

    src = tiny_models["bert"]
    config = AutoConfig.from_pretrained(src, num_labels=2, id2label={0: "0", 1: "1"}, label2id={"0": 0, "1": 1})
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "clf")
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp_path / "clf")
    task = {"dev": str(RESOURCES / "sst2" / "sentiment-dev.tsv"), "text_columns": 1, "label_column": 1}
    split_map = {f"bert.{k}": v for k, v in SPLITS["bert"](config.num_hidden_layers).items()}
    split_map |= {"classifier": "cpu", "dropout": "cpu"}
    got = []
    for extra in ({}, {"device_map": split_map, "offload_folder": str(tmp_path / "offload")}):
        spec = tiny_spec("clf", tmp_path / "clf", **extra)
        loc, kwargs = resolve(spec, None)
        ev, why = classification_evaluation(spec, loc, kwargs, task, 12, 4)
        assert why is None
        assert bool(extra) == hasattr(ev.model, "hf_device_map")
        mask = np.zeros((ev.n_layers, ev.n_heads), dtype=bool)
        mask[1, 2] = True
        d = config.hidden_size // ev.n_heads
        got.append((ev.run(), ev.run(mask, replacement(np.zeros((ev.n_layers, ev.n_heads, d)), "zero"))))
    for a, b in zip(*got):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=0, atol=1e-6)
        np.testing.assert_array_equal(a["correct"], b["correct"])
    assert not np.allclose(got[0][0]["loss"], got[0][1]["loss"])  # the ablated head changed the losses
