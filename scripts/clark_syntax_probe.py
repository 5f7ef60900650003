"""Rule clark_syntax_probe: train the attention-based probing classifiers and score UAS (Clark Table 3)."""

import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821

from headatlas.core.data import load_records  # noqa: E402
from headatlas.clark.glove import Glove  # noqa: E402
from headatlas.core.io import atomic_path  # noqa: E402
from headatlas.clark.parsing_probe import attn_weights, build_probes, evaluate, store_sentences, train  # noqa: E402
from headatlas.core.runner import as_dirs as dirs, setup  # noqa: E402
from headatlas.core.store import AttentionStore  # noqa: E402

sm = snakemake  # noqa: F821


log = setup(sm)
p = sm.params
cfg = p.probe
glove = Glove.from_package(cfg["glove"])
train_records = load_records(sm.input.train_corpus)
t0 = time.time()
with AttentionStore(dirs(sm.input.train_maps)) as store:
    model = store.meta["model"]
    L, H = store.n_layers, store.n_heads
    probes = build_probes(L * H, glove.dim, cfg["hidden"], cfg["seed"])

    def sentences(epoch):
        rng = np.random.default_rng([cfg["seed"], epoch])
        return store_sentences(store, train_records, glove, p.word_mode, rng=rng)

    history = train(probes, cfg["epochs"], sentences, cfg["lr"])
    n_train = len(store)
log.info("%s: trained %s on %d sentences x %d epochs in %.1f s; GloVe OOV rate %.3f", model, list(probes), n_train, cfg["epochs"], time.time() - t0, glove.oov_rate)
rows = []
for split in p.eval_splits:
    t1 = time.time()
    records = load_records(sm.input[f"{split}_corpus"])
    with AttentionStore(dirs(sm.input[f"{split}_maps"])) as store:
        res = evaluate(probes, store_sentences(store, records, glove, p.word_mode))
        n_sent = len(store)
    for name, (correct, n) in res.items():
        rows.append({"model": model, "probe": name, "split": split, "n_sentences": n_sent, "n_words": n, "correct": correct, "uas": correct / n if n else np.nan})
    log.info("%s %s: %s (%.1f s)", model, split, {k: round(c / max(n, 1), 4) for k, (c, n) in res.items()}, time.time() - t1)
hist = pd.DataFrame([{"model": model, "probe": k, "epoch": e, "train_loss_per_word": v} for k, vs in history.items() for e, v in enumerate(vs)])
hist["n_train_sentences"] = n_train
outputs = {"uas": pd.DataFrame(rows), "weights": attn_weights(probes["Attn"], L, H, model), "history": hist}
for key, frame in outputs.items():
    with atomic_path(sm.output[key]) as tmp:
        frame.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
