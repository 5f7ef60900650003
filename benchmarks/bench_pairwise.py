"""The analyses that grow with the square of the head count, at scale (benchmarks/README.md, "Composition and JS
distances at scale"; docs/plan.md, "Scaling rules"): composition (rule circuits_weights) measured and predicted, the
JS distances' cost per sequence and the spread of their head sample (clustering.max_heads).

    # once: a model's folded head weights (head_weights) to a file, so that the model is not in the peak memory
    PYTHONPATH=scripts python benchmarks/bench_pairwise.py dump MODEL_DIR weights.npz
    # composition() under the bounds (one process per setting: the peak is the process's)
    PYTHONPATH=scripts python benchmarks/bench_pairwise.py measure weights.npz [--memory-gb X] [--max-layer-gap K]
    # the cost of a shape under the bounds, from the coefficients measured on Qwen2.5-Coder-1.5B
    PYTHONPATH=scripts python benchmarks/bench_pairwise.py predict --layers 32 --heads 32 --d-model 4096 --d-head 128
    # js_sums of one 128-token causal sequence (random maps) for m heads; the sample's layer test on a finished run
    PYTHONPATH=scripts python benchmarks/bench_pairwise.py js-time 168 336 512
    PYTHONPATH=scripts python benchmarks/bench_pairwise.py js-sample results/clark/qwen15/wiki/js_distance.tsv

Composition's cost model has two terms, both counted exactly as composition() loops: Gram builds (one per writer
head per block, one per reader head, mode and block that reaches its layer; D^2 d multiply-adds each) and Frobenius
products (one per scored pair and mode; D(D+1)/2 multiply-adds each).
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from headatlas.core.plan import GRAM_BUILD_S as BUILD_S
from headatlas.core.plan import PAIR_PRODUCT_S as PAIR_S
from headatlas.core.plan import composition_counts as counts


def predict(a) -> None:
    c = counts(a.layers, a.heads, a.d_model, a.max_layer_gap, a.memory_gb)
    build = c["builds"] * a.d_model**2 * a.d_head * BUILD_S
    pair = 3 * c["pairs"] * a.d_model * (a.d_model + 1) / 2 * PAIR_S
    print(f"{a.layers} x {a.heads} heads, D {a.d_model}, d {a.d_head}; max_layer_gap {a.max_layer_gap}, memory_gb "
          f"{a.memory_gb}: {c['pairs']:,} pairs per mode, {c['blocks']} writer block(s), {c['builds']:,} Gram builds; "
          f"CPU {build:,.0f} s builds + {pair:,.0f} s pairs = {(build + pair) / 3600:.2f} h; Grams held "
          f"{c['gram_gb']:.2f} GiB")  # fmt: skip


def dump(a) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from headatlas.circuits.weights import head_weights

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    hw = head_weights(model.base_model)
    np.savez(a.out, q=hw.q, k=hw.k, v=hw.v, o=hw.o, norm=hw.norm, kv=hw.kv_heads, layout=hw.layout)


def measure(a) -> None:
    import torch

    from headatlas.circuits import weights as W

    torch.set_num_threads(1)
    f = np.load(a.weights)
    hw = W.HeadWeights(q=f["q"], k=f["k"], v=f["v"], o=f["o"], norm=str(f["norm"]), kv_heads=int(f["kv"]),
                       layout=str(f["layout"]))  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t = time.process_time()
    comp = W.composition(hw, a.max_layer_gap, a.memory_gb)
    cpu = time.process_time() - t
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    n_layers, n_heads, d_model, _ = hw.shape
    c = counts(n_layers, n_heads, d_model, a.max_layer_gap, a.memory_gb)
    print(f"max_layer_gap {a.max_layer_gap}, memory_gb {a.memory_gb}: {cpu:.1f} CPU-s, {int(comp['scored'].sum()):,} "
          f"pairs per mode, {c['blocks']} writer block(s), {c['builds']:,} Gram builds; peak RSS {before:.2f} GiB "
          f"with the weights, {after:.2f} GiB after (+{after - before:.2f})")  # fmt: skip


def js_time(a) -> None:
    import torch

    from headatlas.clark.clustering import js_sums, smoothed_cells

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = a.tokens
    for m in a.heads:
        logits = np.where(np.tril(np.ones((n, n), bool)), rng.normal(size=(m, n, n)) * 3, -np.inf)
        maps = np.exp(logits - logits.max(-1, keepdims=True))
        cells = smoothed_cells(maps / maps.sum(-1, keepdims=True), True, 1e-3).astype(np.float32)
        t = time.process_time()
        js_sums(cells)
        cpu = time.process_time() - t
        per = cpu / (m * m / 2 * cells.shape[1]) * 1e9
        print(f"{m} heads, {n} tokens: {cpu:.2f} CPU-s per sequence, {per:.2f} ns per head pair and cell")


def js_sample(a) -> None:
    import pandas as pd

    from headatlas.clark.clustering import distance_square, sample_heads, within_between

    d, index = distance_square(pd.read_csv(a.distances, sep="\t"))
    layers = index["layer"].to_numpy()
    n_layers, n_heads = int(layers.max()) + 1, int(index["head"].max()) + 1
    w0, b0 = within_between(d, layers)
    print(f"{a.distances}: {len(d)} heads ({n_layers} x {n_heads}); within {w0:.5f}, between {b0:.5f}")
    for per in a.per_layer:
        err = []
        for seed in range(a.seeds):
            h = sample_heads(n_layers, n_heads, per * n_layers, seed)
            w, b = within_between(d[np.ix_(h, h)], layers[h])
            err.append((w / w0 - 1, b / b0 - 1, b / w / (b0 / w0) - 1))
        err = np.array(err)
        cols = "; ".join(
            f"{name} {e.mean():+.2%} / {e.std():.2%} / {np.abs(e).max():.2%}"
            for name, e in zip(("within", "between", "ratio"), err.T)
        )
        print(f"  {per} of {n_heads} heads per layer, relative error mean / sd / largest: {cols}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("model")
    d.add_argument("out")
    for name in ("measure", "predict"):
        p = sub.add_parser(name)
        if name == "measure":
            p.add_argument("weights")
        else:
            for key in ("layers", "heads", "d_model", "d_head"):
                p.add_argument("--" + key.replace("_", "-"), type=int, required=True)
        p.add_argument("--memory-gb", type=float, default=4.0)
        p.add_argument("--max-layer-gap", type=int, default=None)
    t = sub.add_parser("js-time")
    t.add_argument("heads", type=int, nargs="+")
    t.add_argument("--tokens", type=int, default=128)
    j = sub.add_parser("js-sample")
    j.add_argument("distances")
    j.add_argument("--per-layer", type=int, nargs="+", default=[2, 4, 6])
    j.add_argument("--seeds", type=int, default=200)
    a = ap.parse_args()
    {"dump": dump, "measure": measure, "predict": predict, "js-time": js_time, "js-sample": js_sample}[a.cmd](a)


if __name__ == "__main__":
    main()
