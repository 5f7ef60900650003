"""A tiny but complete headatlas config: two small random models built locally, small corpora.

Used by the sharding test and by the SLURM check in CI (.ci/slurm/run.sh):

    python tests/tiny_workflow.py build OUT_DIR [--shards N] [--limit N] [--maps full|config|sample|none [--sample K]]
    python tests/tiny_workflow.py compare RESULTS_A RESULTS_B

``build`` writes OUT_DIR/models/{bert,gpt2} (``save_pretrained`` directories with their tokenizers)
and OUT_DIR/config.yaml. The config keeps the default config's corpora and ``analysis:``
block (so every analysis the default config runs also runs here) and the corpora it names,
each cut to ``limit`` records, with bundled paths made absolute and split into ``shards``.
Every corpus keeps all its maps by default (``--maps full``: the outputs of earlier rounds); ``--maps config``
keeps the base config's ``maps:`` settings (the default config reduces wiki and sick fused), ``--maps sample``
/ ``none`` sets every corpus that stores maps to that mode (``--sample K``: sequences a sample keeps).
``compare`` exits 1 unless two result directories hold the same data (see compare_file).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESOURCES = REPO / "resources"
EWT_DEV = RESOURCES / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
WIKI_TEST = RESOURCES / "wikitext2_raw" / "wiki.test.raw"
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BPE_SPECIAL = "<|endoftext|>"
MODEL_NAMES = ("tinybert", "tinygpt2")


def _ewt_words(n_sentences: int = 400) -> list[str]:
    words, done = set(), 0
    with open(EWT_DEV, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                done += 1
                if done == n_sentences:
                    break
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():
                    words.add(cols[1].lower())
    return sorted(words)


def _wordpiece_vocab(path: Path) -> None:
    """Specials, frequent EWT words, and every character alone and as a '##' piece."""
    vocab, seen = [], set()
    for piece in BERT_SPECIALS + _ewt_words():
        if piece not in seen:
            seen.add(piece)
            vocab.append(piece)
    chars = sorted({c for w in vocab for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789.,;:'\"!?-()"))
    for c in chars:
        for piece in (c, "##" + c):
            if piece not in seen:
                seen.add(piece)
                vocab.append(piece)
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")


def wordpiece_tokenizer(vocab_path: str | Path):
    """A lower-casing BERT WordPiece tokenizer over the pieces of ``vocab_path`` (one a line).

    The vocabulary goes in as a dict: transformers 5 ignores ``vocab_file=`` and would leave
    only the 5 special tokens, so every word would become [UNK].
    """
    from transformers import BertTokenizerFast

    pieces = Path(vocab_path).read_text(encoding="utf-8").splitlines()
    return BertTokenizerFast(vocab={p: i for i, p in enumerate(pieces)}, do_lower_case=True)


def bpe_tokenizer():
    """A byte-level BPE tokenizer (vocabulary 500) trained on the first 300 WikiText-2 test lines."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    lines = []
    with open(WIKI_TEST, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lines.append(line.strip())
            if len(lines) >= 300:
                break
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=500, min_frequency=2, show_progress=False, special_tokens=[BPE_SPECIAL])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token=BPE_SPECIAL,
        eos_token=BPE_SPECIAL,
        unk_token=BPE_SPECIAL,
        pad_token=BPE_SPECIAL,
    )


def build_models(root: str | Path) -> dict[str, Path]:
    """Save a tiny random BERT (encoder) and GPT-2 (decoder) with their tokenizers under ``root``.

    Deterministic: the same weights and vocabularies on every call.
    """
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    root = Path(root)
    dirs = {"tinybert": root / "bert", "tinygpt2": root / "gpt2"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)

    vocab = root / "wordpiece_vocab.txt"
    _wordpiece_vocab(vocab)
    wp = wordpiece_tokenizer(vocab)
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=len(wp),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=256,
        )
    )
    bert.save_pretrained(dirs["tinybert"])
    wp.save_pretrained(dirs["tinybert"])

    bpe = bpe_tokenizer()
    eot = bpe.convert_tokens_to_ids(BPE_SPECIAL)
    torch.manual_seed(2)
    gpt2 = GPT2Model(
        GPT2Config(
            vocab_size=len(bpe),
            n_layer=2,
            n_head=4,
            n_embd=32,
            n_positions=256,
            bos_token_id=eot,
            eos_token_id=eot,
            pad_token_id=eot,
        )
    )
    gpt2.save_pretrained(dirs["tinygpt2"])
    bpe.save_pretrained(dirs["tinygpt2"])
    return dirs


# what a run writes in a checkout: never read from there (a test must not depend on the user's results)
RUN_OUTPUTS = ("results", "logs", ".snakemake")


def _absolute(path: str) -> str:
    """A bundled input path made absolute (the tiny run works in its own directory); a path to what a rule
    writes (``results/...``) stays relative, so the tiny run builds it, whatever the checkout's results/ holds."""
    p = Path(path)
    if not p.is_absolute() and p.parts[:1] and p.parts[0] not in RUN_OUTPUTS and (REPO / p).exists():
        return str(REPO / p)
    return path


def _strings(value) -> set[str]:
    """Every string anywhere in a nested config value."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value)) if value else set()
    return set()


def tiny_config(
    model_dirs: dict[str, Path],
    shards: int = 1,
    limit: int = 12,
    base: str | Path | None = None,
    analyses: list[str] | None = None,
    corpora: list[str] | None = None,
    maps: str = "full",
    sample: int | None = None,
) -> dict:
    """The default config (or ``base``) on the tiny models, with small sharded corpora.

    Only the corpora that the ``analysis:`` block names are kept (every model is extracted on
    every corpus of a config, so unused corpora would only cost time); if it names none, the
    first corpus is kept. ``analyses`` keeps only those sections of the ``analysis:`` block
    (None: all of them); ``corpora`` cuts every section's ``corpora`` list to those corpora.
    Generated corpora (kind ``records``) are not cut (a prefix would hold one task's train items
    only); the Jo & Myaeng generator and downstream sizes shrink instead (train 2 x limit, dev and
    test limit, 4 WordContent words).
    ``maps`` (full, config, sample, none) and ``sample``: see the module docstring; a corpus with
    ``maps: false`` (representations only) keeps it.
    """
    if maps not in ("full", "config", "sample", "none"):
        raise ValueError(f"maps must be full, config, sample or none, not {maps!r}")
    with open(base or REPO / "config" / "config.yaml", encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    cfg["models"] = [
        {"name": name, "source": {"path": str(d)}, "max_length": 64, "batch_size": 4, "device": "cpu"}
        for name, d in model_dirs.items()
    ]
    cfg.pop("finetune_tasks", None)
    if analyses is not None:
        unknown = sorted(set(analyses) - set(cfg.get("analysis", {})))
        if unknown:
            raise ValueError(f"analyses {unknown} are not sections of the base config's analysis: block")
        cfg["analysis"] = {k: v for k, v in cfg["analysis"].items() if k in analyses}
    if corpora is not None:
        for section in cfg.get("analysis", {}).values():
            if isinstance(section.get("corpora"), list):
                section["corpora"] = [c for c in section["corpora"] if c in corpora]
    named = _strings(cfg.get("analysis", {}))
    used = [c for c in cfg["corpora"] if c in named] or list(cfg["corpora"])[:1]
    kept = {}
    for name in used:
        spec = copy.deepcopy(cfg["corpora"][name])
        if "path" in spec:
            spec["path"] = _absolute(spec["path"])
        if "paths" in spec:
            spec["paths"] = [_absolute(p) for p in spec["paths"]]
        if spec.get("kind") in ("wikitext", "wikitext_long"):
            spec["n_segments"] = min(spec.get("n_segments", limit), limit)
        if spec.get("kind") != "records":  # generated corpora are sized by their generator (below), not cut
            spec["limit"] = limit
        spec.pop("shards", None)
        if spec.get("maps", True) is not False and maps != "config":
            spec.pop("sample", None)
            spec["maps"] = maps
            if maps == "full":
                del spec["maps"]
        if spec.get("maps") == "sample" and sample is not None:
            spec["sample"] = sample
        kept[name] = spec
    cfg["corpora"] = kept
    jm = cfg.get("analysis", {}).get("jomyaeng")
    if jm:  # a prefix of the generated sentences would hold one task's train items only: shrink every task instead
        small = {"train": 2 * limit, "dev": limit, "test": limit}
        jm.setdefault("generator", {})["sizes"] = dict(small)
        jm["generator"]["wc_words"] = min(jm["generator"].get("wc_words", 30), 4)
        for task in jm.get("downstream", {}).values():
            task["sizes"] = dict(small)
    cfg.setdefault("extraction", {})
    cfg["extraction"].update(shards=shards, threads=1)
    return cfg


def write_tiny(
    out: str | Path,
    shards: int = 1,
    limit: int = 12,
    base: str | Path | None = None,
    analyses: list[str] | None = None,
    corpora: list[str] | None = None,
    models: list[str] | None = None,
    maps: str = "full",
    sample: int | None = None,
) -> Path:
    """Build the models under ``out``/models and write ``out``/config.yaml; return the config path."""
    out = Path(out).resolve()
    dirs = build_models(out / "models")
    if models is not None:
        unknown = sorted(set(models) - set(dirs))
        if unknown:
            raise ValueError(f"unknown tiny models {unknown}; known: {sorted(dirs)}")
        dirs = {k: v for k, v in dirs.items() if k in models}
    path = out / "config.yaml"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(tiny_config(dirs, shards, limit, base, analyses, corpora, maps, sample), fh, sort_keys=False)
    os.replace(tmp, path)
    return path


def _h5_items(path: Path) -> dict:
    """name -> (value or array, attrs) of every dataset and group in an HDF5 file."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        out["/"] = (None, dict(f.attrs))

        def visit(name, obj):
            data = obj[()] if isinstance(obj, h5py.Dataset) else None
            out[name] = (data, dict(obj.attrs))

        f.visititems(visit)
    return out


def _same(a, b) -> bool:
    import numpy as np

    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    return a == b


def compare_file(a: Path, b: Path) -> str | None:
    """Why two result files differ, or None when they hold the same data.

    HDF5: every dataset and attribute equal (bit for bit); gzip: the same decompressed bytes;
    figures (png, svg, pdf, html): both non-empty (their bytes embed dates and versions);
    everything else (TSV, JSON, text): the same bytes.
    """
    import gzip

    suffix = a.suffix.lower()
    if suffix in (".png", ".svg", ".pdf", ".html"):
        return None if a.stat().st_size and b.stat().st_size else "empty figure"
    if suffix in (".h5", ".hdf5"):
        x, y = _h5_items(a), _h5_items(b)
        if x.keys() != y.keys():
            return f"HDF5 objects differ: {sorted(x.keys() ^ y.keys())[:5]}"
        for name in x:
            if not _same(x[name][0], y[name][0]):
                return f"HDF5 dataset {name} differs"
            if not _same(x[name][1], y[name][1]):
                return f"HDF5 attributes of {name} differ"
        return None
    if suffix == ".gz":
        return None if gzip.open(a).read() == gzip.open(b).read() else "decompressed contents differ"
    return None if a.read_bytes() == b.read_bytes() else "contents differ"


def compare_results(a: str | Path, b: str | Path, pattern: str = "**/*", exclude: tuple[str, ...] = ()) -> list[str]:
    """Differences between the files matching ``pattern`` under two result directories ([] = same).

    Paths starting with one of ``exclude`` (relative to the directories) are skipped, and so
    are Snakemake's .snakemake_timestamp markers and the jobs' benchmark files (``benchmarks/``:
    timings, never equal between runs).
    """
    a, b = Path(a), Path(b)

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.glob(pattern)
            if p.is_file()
            and p.name != ".snakemake_timestamp"
            and not str(p.relative_to(root)).startswith((*exclude, "benchmarks/"))
        }

    fa, fb = files(a), files(b)
    problems = [f"only in {a}: {p}" for p in sorted(fa - fb)] + [f"only in {b}: {p}" for p in sorted(fb - fa)]
    for rel in sorted(fa & fb):
        why = compare_file(a / rel, b / rel)
        if why:
            problems.append(f"{rel}: {why}")
    return problems


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the tiny models and write OUT/config.yaml")
    build.add_argument("out", help="directory for models/ and config.yaml")
    build.add_argument("--shards", type=int, default=1, help="shards per corpus (default 1)")
    build.add_argument("--limit", type=int, default=12, help="records per corpus (default 12)")
    build.add_argument("--base", help="config to shrink (default config/config.yaml)")
    build.add_argument("--analyses", help="comma-separated sections of its analysis: block to keep (default: all)")
    build.add_argument("--corpora", help="comma-separated corpora the analyses keep (default: all they name)")
    build.add_argument("--models", help=f"comma-separated models of the config (default: {','.join(MODEL_NAMES)})")
    build.add_argument(
        "--maps",
        default="full",
        choices=["full", "config", "sample", "none"],
        help="maps of every corpus: full (default), as the base config says, sample or none (fused reduction)",
    )
    build.add_argument("--sample", type=int, help="sequences a maps: sample corpus keeps (default: the config's, 32)")
    compare = sub.add_parser("compare", help="exit 1 unless two result directories hold the same data")
    compare.add_argument("a")
    compare.add_argument("b")
    args = parser.parse_args(argv)
    if args.command == "build":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        analyses = args.analyses.split(",") if args.analyses else None
        corpora = args.corpora.split(",") if args.corpora else None
        models = args.models.split(",") if args.models else None
        print(
            write_tiny(args.out, args.shards, args.limit, args.base, analyses, corpora, models, args.maps, args.sample)
        )
        return
    problems = compare_results(args.a, args.b)
    n = sum(
        1
        for p in Path(args.a).rglob("*")
        if p.is_file() and p.name != ".snakemake_timestamp" and p.relative_to(args.a).parts[0] != "benchmarks"
    )
    for p in problems:
        print(p)
    print(
        f"{n} files under {args.a} compared with {args.b}: "
        + ("identical" if not problems else f"{len(problems)} differences")
    )
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
