"""Time Pande's sieve reducer (``SieveReducer``, eager path) on one batch of random maps, and save its scores.

For an A/B of a change to the reducer (docs/architecture.md: roles by name), run it on both trees and compare
the scores bit for bit (the maps are seeded)::

    git archive <before> scripts/headatlas | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/scripts .venv/bin/python benchmarks/bench_pande_roles.py --out /tmp/before.npy
    .venv/bin/python benchmarks/bench_pande_roles.py --out /tmp/after.npy --compare /tmp/before.npy

One batch of 16 sequences of 92-96 tokens (a [CLS], content, two [SEP]; every other one a sentence pair, with
random dependency trees), 12 heads, 6 layers, torch on one thread; the CPU time of ``update`` of every layer plus
``result`` (the batch's plan included), the median and minimum of ``--reps`` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headatlas.core.data import SPECIAL_CLS, SPECIAL_SEP, Record
from headatlas.core.layer_view import feed_layer
from headatlas.core.reducer import FeedInfo, ReduceBatch
from headatlas.pande.reducers import SieveReducer
from headatlas.pande.sieves import SieveSettings

B, N, H, L = 16, 96, 12, 6


def inputs():
    rng = np.random.default_rng(0)
    rows, recs = [], []
    for b in range(B):
        m = N - 2 * (b % 3)
        w = m - 3
        seg = np.r_[np.zeros(w // 2 + 2, int), np.ones(m - w // 2 - 2, int)] if b % 2 else np.zeros(m, int)
        special = np.r_[[SPECIAL_CLS], np.zeros(w, int), [SPECIAL_SEP, SPECIAL_SEP]]
        word = np.r_[[-1], np.arange(w), [-1, -1]]
        rows.append({"word": word, "special": special, "segment": seg, "piece": np.array(["x"] * m, dtype=object)})
        head = tuple(int(x) for x in rng.integers(-1, w, w))
        deprel = tuple(str(x) for x in rng.choice(["nsubj", "obj", "amod", "advmod", "det"], w))
        words = tuple(f"w{i}" for i in range(w))
        recs.append(
            Record(id=str(b), words=words, segment=tuple(int(s) for s in seg[1 : w + 1]), head=head, deprel=deprel)
        )
    torch.manual_seed(0)
    maps = [torch.softmax(torch.randn(B, H, N, N), -1) for _ in range(L)]
    return rows, recs, maps


def run(rows, recs, maps):
    batch = ReduceBatch.from_rows(np.arange(B), rows, np.arange(B), [len(r.words) for r in recs], recs)
    r = SieveReducer(SieveSettings())
    info = FeedInfo(n_sequences=B, n_layers=L, n_heads=H)
    r.start(info)
    t = time.process_time()  # CPU time of this process (wall time on a loaded machine is not the reducer's)
    for layer in range(L):
        feed_layer([r], info, layer, maps[layer], batch)
    scores = r.result()["scores"]
    return time.process_time() - t, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", help="save the scores (.npy)")
    ap.add_argument("--compare", help="scores (.npy) of another tree that must be bit-identical")
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = inputs()
    run(*data)
    ts = []
    for _ in range(a.reps):
        dt, scores = run(*data)
        ts.append(dt)
    print(
        f"CPU time median {np.median(ts) * 1e3:.1f} ms, min {min(ts) * 1e3:.1f} ms per batch ({B} x {N} tokens, {H} heads, {L} layers)"
    )
    if a.out:
        np.save(a.out, scores)
    if a.compare:
        same = np.array_equal(np.load(a.compare), scores, equal_nan=True)
        print("scores bit-identical to", a.compare, "" if same else ": NO")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
