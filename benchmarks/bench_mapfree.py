"""Map-free extraction against the model's SDPA forward (CPU, one thread, modes alternating in one process).

Run from the repository root with the project's environment::

    PYTHONPATH=scripts python benchmarks/bench_mapfree.py --out benchmarks/results_mapfree.json
    PYTHONPATH=scripts python benchmarks/bench_mapfree.py --runs smollm2:2048:1 --reps 2   # one setting
    PYTHONPATH=scripts python benchmarks/bench_mapfree.py --scaling smollm2:2048:1,smollm2:8192:1 \
        --out /tmp/scaling.json --figure /tmp/scaling.png   # each mode in its own process: time, peak RSS

Inputs: WikiText-2 running text cut to the length (``wiki_long_segments``, a few inputs per setting:
``--runs model:length:inputs,...``). Per setting, every mode runs once (a warm-up, unless ``--no-warmup``), then
once per repetition, in rotation, on the same loaded model (``torch.set_num_threads(1)``), and each mode's time is
its fastest repetition:

- ``sdpa``: the model's forward with transformers' SDPA attention (the baseline of every ratio);
- ``eager``: the same forward with eager attention (the maps exist; the reference path runs it);
- ``eager_fused``: :func:`headatlas.core.reduce.fused_reduce` on the eager path with every map-free reducer
  (position-bucket statistics, detectors);
- ``free_targets``: the map-free path with the detectors only (a few target keys per query);
- ``free_entropy``: the detectors and the row entropy;
- ``free_all``: the map-free path with every map-free reducer (the targets, the entropy, the position column
  and for an encoder the two lower columns of the mean distance).

The per-statistic cost is the difference between consecutive map-free modes (on a CPU every one of them is the
same attention pass, :mod:`headatlas.core.cpu_pass`, with more sums; ``--no-cpu-pass`` measures the torch path
without it: the fused kernel, or the blocked products once a statistic needs more than targets; ``--wide-kernel
flash_cpu`` puts those widened values on the CPU flash kernel instead, the comparison behind that choice).
``--equality`` also reports the max abs difference of every map-free reducer's result, map-free against eager-fused, on the same inputs.
The machine may be shared: ratios within one process and rotation are the comparable numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_scaling import BOS, MODELS, WIKI, model_dir  # noqa: E402

MODES = ("sdpa", "eager", "eager_fused", "free_targets", "free_entropy", "free_all")


def reducers(mode: str):
    from headatlas.core.reducer import Needs, Reducer
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.position.reducers import PositionReducer

    class EntropyPass(Reducer):  # the entropy pass alone (its result is discarded): the cost of one K pass
        name = "entropy_pass"

        def layer_needs(self, batch, causal):
            return Needs(entropy=True)

        def update(self, layer, view, batch):
            view.entropy()

        def result(self):
            return None

    if mode == "free_targets":
        return [DetectorReducer()]
    if mode == "free_entropy":
        return [DetectorReducer(), EntropyPass()]
    return [PositionReducer(), DetectorReducer()]


def max_diff(a, b) -> float:
    import numpy as np

    if hasattr(a, "columns"):
        return max(max_diff(a[c].to_numpy(), b[c].to_numpy()) for c in a.columns if a[c].dtype.kind == "f")
    if isinstance(a, dict):
        return max(max_diff(a[k], b[k]) for k in a)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = ~np.isnan(a) & ~np.isnan(b)
    # absolute for fractions and nats, relative above 1 (mean distances in tokens: float32 rounds them to ~1e-7 x)
    return float((np.abs(a[ok] - b[ok]) / np.maximum(1.0, np.abs(a[ok]))).max()) if ok.any() else 0.0


def run_setting(
    name: str,
    length: int,
    n_inputs: int,
    reps: int,
    cache: Path,
    equality: bool,
    modes,
    warmup: bool = True,
) -> dict:
    from headatlas.core.corpora import wiki_long_segments
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce

    entry = dict(MODELS[name], name=name, max_length=length, batch_size=max(1, n_inputs))
    if name in BOS:
        entry["bos_token"] = BOS[name]
    spec = ModelSpec.from_config(entry)
    model, tok, config = load(spec, model_dir(name, cache), device="cpu")
    kind = model_kind(config, spec)
    records = wiki_long_segments(WIKI, n_inputs, length, seed=0)
    tokenized, _ = tokenize_records(records, tok, kind, length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    bs = len(tokenized)

    def run(mode: str):
        if mode in ("sdpa", "eager"):
            model.set_attn_implementation(mode)
            try:
                return bare_forward(model, tokenized, bs, pad), None
            finally:
                model.set_attn_implementation("eager")
        path = "eager" if mode == "eager_fused" else "mapfree"
        t0 = time.perf_counter()
        res = fused_reduce(model, tokenized, reducers(mode), bs, kind, None, pad, name, "wiki", path=path)
        return time.perf_counter() - t0, res

    if warmup:  # each mode once before the timed runs: one-time costs would count against short inputs
        for m in modes:
            run(m)
    times = {m: [] for m in modes}
    cpu_times = {m: [] for m in modes}
    rss = {}  # peak RSS of the process after each mode's first run (modes in --modes order)
    for _ in range(reps):
        for m in modes:
            c0 = time.process_time()
            times[m].append(run(m)[0])
            cpu_times[m].append(time.process_time() - c0)
            rss.setdefault(m, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    best = {m: min(t) for m, t in times.items()}
    out = {
        "model": name,
        "length": length,
        "inputs": len(tokenized),
        "tokens": int(sum(len(t) for t in tokenized)),
        "seconds": best,
        "all_seconds": times,
        "ratio_to_sdpa": {m: best["sdpa"] / best[m] for m in modes} if "sdpa" in best else {},
        "cpu_seconds": {m: min(t) for m, t in cpu_times.items()},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_mb_after": rss,
    }
    if equality:
        e = run("eager_fused")[1]
        f = run("free_all")[1]
        out["max_abs_diff"] = {r.name: max_diff(a, b) for r, a, b in zip(reducers("free_all"), e, f)}
    return out


SCALING_MODES = ("sdpa", "eager", "eager_fused", "free_all")


def one_run(name: str, length: int, n_inputs: int, mode: str, cache: Path) -> dict:
    """``mode`` once on a freshly loaded model in this process: CPU-seconds of the run (``time.process_time``)
    and the process's peak RSS after it (the scaling figure's points; each in its own process)."""
    # one warm-up run of the mode where it is cheap (one-time start-up costs would count against short inputs)
    out = run_setting(name, length, n_inputs, 1, cache, False, (mode,), warmup=length <= 2048)
    return {k: out[k] for k in ("model", "length", "inputs", "tokens", "peak_rss_mb")} | {
        "mode": mode,
        "cpu_seconds": out["cpu_seconds"][mode],
        "seconds": out["seconds"][mode],
    }


def scaling(runs: str, cache: Path, out: Path | None, modes=SCALING_MODES, flags=()) -> list:
    """Every (model, length, inputs) of ``runs`` and every mode in its own process (``--one``, with ``flags``)."""
    import subprocess

    rows = []
    for item in runs.split(","):
        for mode in modes:
            cmd = [sys.executable, __file__, "--one", f"{item}:{mode}", "--cache", str(cache), *flags]
            got = subprocess.run(cmd, capture_output=True, text=True)
            if got.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{got.stderr[-2000:]}")
            rows.append(json.loads(got.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{item} {mode}: {r['cpu_seconds']:.1f} CPU-s, {1e3 * r['cpu_seconds'] / r['tokens']:.2f} ms/token, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
            if out:
                out.write_text(json.dumps({"threads": 1, "scaling": rows}, indent=1) + "\n")
    return rows


LABELS = {
    "sdpa": "SDPA forward (baseline)",
    "eager": "eager forward (maps exist)",
    "eager_fused": "eager-fused statistics (reference)",
    "free_all": "map-free statistics",
}


def scaling_figure(rows: list, png: Path) -> None:
    """CPU-milliseconds per token and peak RSS against input length, one line per mode, per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    styles = {"sdpa": ("k", "-"), "eager": ("tab:orange", ":"), "eager_fused": ("tab:red", "--"),
              "free_all": ("tab:blue", "-")}  # fmt: skip
    marks = dict(zip(models, "os^D"))
    for m in models:
        for mode in LABELS:
            pts = sorted((r["length"], r) for r in rows if r["model"] == m and r["mode"] == mode)
            if not pts:
                continue
            x = [p[0] for p in pts]
            c, ls = styles[mode]
            kw = dict(color=c, ls=ls, marker=marks[m], label=f"{m}: {LABELS[mode]}")
            axes[0].plot(x, [1e3 * p[1]["cpu_seconds"] / p[1]["tokens"] for p in pts], **kw)
            axes[1].plot(x, [p[1]["peak_rss_mb"] / 1024 for p in pts], **kw)
    for ax, ylab in zip(axes, ("CPU milliseconds per token (one thread)", "peak RSS of the process (GB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(ylab)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle("Per-head statistics with and without attention maps, against input length (CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=150)
    plt.close(fig)


def main(argv=None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="minilm:128:16,minilm:512:4,smollm2:128:16,smollm2:512:4,smollm2:2048:1")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", default=None, help=f"default {','.join(MODES)}; --scaling: {','.join(SCALING_MODES)}")
    p.add_argument("--no-cpu-pass", action="store_true", help="the map-free path without the CPU attention pass")
    p.add_argument("--wide-kernel", default=None, help="a fused kernel (flash_cpu) for the one path's widened values "
                   "instead of the blocked products (kernel_order's choice): the comparison behind that choice")  # fmt: skip
    p.add_argument("--equality", action="store_true", help="also max abs diff, map-free vs eager-fused")
    p.add_argument("--no-warmup", action="store_true", help="no warm-up forward (long inputs)")
    p.add_argument("--cache", type=Path, default=REPO / "results" / "models" / "bench")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--scaling", default=None, help="model:length:inputs,... each mode in its own process")
    p.add_argument("--figure", type=Path, default=None, help="the scaling figure (PNG) from --scaling or --out")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # model:length:inputs:mode (--scaling's worker)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.no_cpu_pass:
        from headatlas.core import cpu_pass

        cpu_pass.library = lambda: None
    if args.wide_kernel:
        from headatlas.core import mapfree

        order = mapfree.kernel_order
        mapfree.kernel_order = lambda device, dtype, wide=False: (args.wide_kernel,) if wide else order(device, dtype)
    if args.one:
        name, length, n, mode = args.one.split(":")
        print(json.dumps(one_run(name, int(length), int(n), mode, args.cache)))
        return
    if args.scaling or (args.figure and args.out and args.out.exists()):
        modes = tuple(args.modes.split(",")) if args.modes else SCALING_MODES
        flags = (("--no-cpu-pass",) if args.no_cpu_pass else ()) + (
            ("--wide-kernel", args.wide_kernel) if args.wide_kernel else ()
        )
        rows = (
            scaling(args.scaling, args.cache, args.out, modes, flags)
            if args.scaling
            else json.loads(args.out.read_text())["scaling"]
        )
        if args.figure:
            scaling_figure(rows, args.figure)
        return
    modes = tuple(args.modes.split(",")) if args.modes else MODES
    results = []
    for item in args.runs.split(","):
        name, length, n = item.split(":")
        r = run_setting(name, int(length), int(n), args.reps, args.cache, args.equality, modes, not args.no_warmup)
        results.append(r)
        line = "  ".join(f"{m} {r['ratio_to_sdpa'][m]:.3f}" for m in modes)
        print(f"{name} {length} x{r['inputs']}: sdpa {r['seconds']['sdpa']:.2f} s; ratio to sdpa: {line}", flush=True)
        if "max_abs_diff" in r:
            print(f"  max abs diff map-free vs eager-fused: {r['max_abs_diff']}", flush=True)
        if args.out:
            args.out.write_text(json.dumps({"threads": 1, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
