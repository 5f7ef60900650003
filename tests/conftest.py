"""Shared fixtures: tiny random models built locally (no network), bundled corpora paths; the one way the tests
run the workflow (:func:`run_snakemake`, :func:`dry_run`).

Every model is written with ``save_pretrained`` (with its tokenizer) into a session
temporary directory and loaded back through :func:`headatlas.core.models.load`, the same path
the workflow uses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# Never reach the Hugging Face hub from the tests (the tiny models are local directories).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
if not _cuda_available():
    # Triton's interpreter runs the GPU's Triton kernel on CPU tensors (core/triton_pass.py); it must be on before
    # Triton is first imported. With a CUDA device the tests run the compiled kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tiny_workflow import (  # noqa: F401, E402
    BERT_SPECIALS,
    BPE_SPECIAL,
    EWT_DEV,
    REPO,
    RESOURCES,
    WIKI_TEST,
    wordpiece_tokenizer,  # noqa: E402
)
from tiny_workflow import bpe_tokenizer as train_bpe_tokenizer  # noqa: E402

SICK_TEST = RESOURCES / "sick" / "sicktest-ent.tsv"
TINY_NAMES = ("bert", "electra", "gpt2", "llama")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped where torch sees no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# --- the workflow as a subprocess -------------------------------------------------------------


def run_snakemake(
    workdir: Path | None,
    config: dict | None,
    *args: str,
    cores: int = 2,
    timeout: float | None = 900,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run Snakemake on the repository's workflow in ``workdir`` (None: from the repository root with no
    --snakefile or --directory, as a user types it). ``config`` is written to workdir/config.yaml and passed
    as --configfile (None: only what ``args`` give). ``env``: variables set on top of this environment, whose
    PATH starts with this Python's bin directory (the rules' shell commands find its python)."""
    env = dict(os.environ, **(env or {}))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "snakemake"]
    if workdir is not None:
        cmd += ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    if config is not None:
        cfg = workdir / "config.yaml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        cmd += ["--configfile", str(cfg)]
    cmd += ["--cores", str(cores), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir or REPO)


def output_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + "\n" + proc.stderr


def parse_jobs(text: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, wildcards) of every job a (dry) run lists."""
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        m = re.match(r"^\s*(?:local)?rule (\w+):\s*$", line)
        if m:
            jobs.append((m.group(1), {}))
            continue
        m = re.match(r"^(?:local)?rule (\w+)(?: \((.*)\))?: jobid \d+$", line)  # one line a job (core.terminal)
        if m:
            jobs.append((m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split(", ")) if m.group(2) else {}))
            continue
        m = re.match(r"^\s+wildcards: (.*)$", line)
        if m and jobs:
            jobs[-1][1].update(kv.split("=", 1) for kv in m.group(1).split(", "))
    return jobs


def job_stats(text: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run, without the total."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Job stats:")
    except StopIteration:
        return {}
    counts = {}
    for line in lines[start + 3 :]:
        m = re.match(r"^(\w+)\s+(\d+)\s*$", line)
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    counts.pop("total", None)
    return counts


def dry_run(
    workdir: Path | None, config: dict | None, *args: str, **kw
) -> tuple[dict[str, int], list[tuple[str, dict[str, str]]], str]:
    """A dry run (:func:`run_snakemake`, same arguments) that must succeed: (job stats, jobs, stdout and
    stderr); the jobs it lists and its summary table agree."""
    proc = run_snakemake(workdir, config, "--dry-run", *args, **kw)
    text = output_of(proc)
    assert proc.returncode == 0, text[-4000:]
    jobs, stats = parse_jobs(proc.stdout), job_stats(proc.stdout)
    listed: dict[str, int] = {}
    for rule, _ in jobs:
        listed[rule] = listed.get(rule, 0) + 1
    assert listed == stats, text[-4000:]
    return stats, jobs, text


# --- corpora and models ---------------------------------------------------------------------


def first_conllu_sentences(path: Path, n: int) -> str:
    """The text of the first ``n`` sentences of a CoNLL-U file (comments included)."""
    lines: list[str] = []
    done = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            lines.append(line)
            if not line.strip():
                done += 1
                if done == n:
                    break
    return "".join(lines)


def tiny_spec(name: str, directory: Path, **overrides):
    from headatlas.core.models import ModelSpec

    entry = {"name": name, "source": {"path": str(directory)}, "max_length": 64, "batch_size": 4}
    entry.update(overrides)
    return ModelSpec.from_config(entry)


def load_tiny(name: str, directory: Path, **overrides):
    """(spec, model, tokenizer, config) of a tiny model, on the CPU."""
    from headatlas.core.models import load

    spec = tiny_spec(name, directory, **overrides)
    model, tokenizer, config = load(spec, device="cpu")
    return spec, model, tokenizer, config


@pytest.fixture(scope="session")
def ewt_head_file(tmp_path_factory) -> Path:
    """The first 40 sentences of the bundled EWT dev file."""
    path = tmp_path_factory.mktemp("ewt") / "ewt_head.conllu"
    path.write_text(first_conllu_sentences(EWT_DEV, 40), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def ewt_records(ewt_head_file):
    from headatlas.core.corpora import read_conllu, sentence_records

    return sentence_records(read_conllu(ewt_head_file))


@pytest.fixture(scope="session")
def records(ewt_records):
    """Twelve EWT sentences and two sentence pairs (segments A and B): the extraction tests' inputs."""
    from headatlas.core.data import Record

    pairs = [
        Record(
            id="pair-0", words=("The", "court", "ruled", ".", "It", "was", "final", "."), segment=(0,) * 4 + (1,) * 4
        ),
        Record(id="pair-1", words=("Bush", "nominated", "two", "jurists"), segment=(0, 0, 1, 1)),
    ]
    return list(ewt_records[:12]) + pairs


@pytest.fixture(scope="session")
def bert_vocab_file(tmp_path_factory, ewt_records) -> Path:
    """A WordPiece vocabulary from EWT words; long words only as prefix + '##' pieces."""
    vocab = list(BERT_SPECIALS)
    seen = set(vocab)

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            vocab.append(piece)

    words = sorted({w.lower() for r in ewt_records for w in r.words})
    for w in words:
        if len(w) >= 7 and w.isalpha():
            add(w[:4])
            add("##" + w[4:])
        else:
            add(w)
    for c in sorted({c for w in words for c in w}):
        add(c)
        add("##" + c)
    path = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def bpe_tokenizer_object():
    """The tiny workflow's byte-level BPE tokenizer (vocabulary 500, WikiText-2 test lines)."""
    return train_bpe_tokenizer()


def tiny_llama_config(vocab_size: int, eot: int, **overrides):
    """The tiny Llama shape shared by the tests: 2 layers, 4 query heads over 2 KV heads, width 32."""
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, bert_vocab_file, bpe_tokenizer_object) -> dict[str, Path]:
    """name -> save_pretrained directory of tiny random BERT, ELECTRA, GPT-2 and Llama."""
    import torch
    from transformers import (
        BertConfig,
        BertModel,
        ElectraConfig,
        ElectraModel,
        GPT2Config,
        GPT2Model,
        LlamaModel,
    )

    root = tmp_path_factory.mktemp("tiny_models")
    dirs = {name: root / name for name in TINY_NAMES}

    wp = wordpiece_tokenizer(bert_vocab_file)
    n_wp = len(wp)
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=n_wp,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=256,
        )
    )
    bert.save_pretrained(dirs["bert"])
    wp.save_pretrained(dirs["bert"])

    torch.manual_seed(1)
    electra = ElectraModel(
        ElectraConfig(
            vocab_size=n_wp,
            embedding_size=32,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=256,
        )
    )
    electra.save_pretrained(dirs["electra"])
    wp.save_pretrained(dirs["electra"])

    bpe = bpe_tokenizer_object
    n_bpe, eot = len(bpe), bpe.convert_tokens_to_ids(BPE_SPECIAL)
    torch.manual_seed(2)
    gpt2 = GPT2Model(
        GPT2Config(
            vocab_size=n_bpe,
            n_layer=2,
            n_head=4,
            n_embd=32,
            n_positions=256,
            bos_token_id=eot,
            eos_token_id=eot,
            pad_token_id=eot,
        )
    )
    gpt2.save_pretrained(dirs["gpt2"])
    bpe.save_pretrained(dirs["gpt2"])

    torch.manual_seed(3)
    llama = LlamaModel(tiny_llama_config(n_bpe, eot))
    llama.save_pretrained(dirs["llama"])
    bpe.save_pretrained(dirs["llama"])
    return dirs


@pytest.fixture(scope="session")
def tiny_loaded(tiny_models):
    """name -> (spec, model, tokenizer, config), loaded once per session through headatlas.core.models.load."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_tiny(name, tiny_models[name])
        return cache[name]

    return get


@pytest.fixture(scope="session")
def bert_tokenizer(tiny_loaded):
    return tiny_loaded("bert")[2]


@pytest.fixture(scope="session")
def bpe_tokenizer(tiny_loaded):
    return tiny_loaded("gpt2")[2]


@pytest.fixture(scope="session")
def golden_results(tmp_path_factory):
    """results/ of one run of the golden tiny configuration (test_golden.run_tiny: every analysis), shared by
    the slow tests that read a whole run (acceptance/: the digests, and test_golden_run.py)."""
    from acceptance.test_golden import run_tiny

    return run_tiny(tmp_path_factory.mktemp("golden"))
