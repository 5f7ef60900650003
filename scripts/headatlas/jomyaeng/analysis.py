"""Jo & Myaeng (2020): what each attention head's sentence representation encodes.

For every task, one probe per head on the head's context vector (``AttentionStore.head_vectors``,
[CLS] for encoders, the last real token for decoders), one per layer on the hidden state
at the same position (the layer baseline), a control probe per head on the task's control
labels (selectivity = task accuracy - control accuracy, Hewitt & Liang 2019), and the top-n
reconstruction: heads ranked by dev accuracy, the vectors of the best n concatenated and
probed again. Pair tasks (SICK) encode each sentence separately and use SentEval's
[|u - v|, u * v] features per head, per layer and for the concatenated top-n heads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ..core.figures import head_label
from ..core.io import head_shape
from ..core.progress import Progress
from ..core.settings import Settings
from .probes import SPLITS, ProbeConfig, pair_features, relatedness_targets, train_probes

log = logging.getLogger("headatlas.jomyaeng.analysis")

CATEGORIES = {
    "surface": ("SentLen", "WordContent"),
    "syntactic": ("TreeDepth", "TopConstituents", "BigramShift"),
    "semantic": ("Tense", "SubjNumber", "ObjNumber", "OddManOut", "CoordinationInversion"),
}

# Jo & Myaeng's BERT-base numbers (test accuracy %, repo tables, see docs/methods §2.8):
# last layer, best layer (chosen on test in their code), top-12 heads.
PAPER_BERT_BASE = {
    "SentLen": (57.95, 87.80, 95.0),
    "WordContent": (25.18, 25.18, 73.1),
    "TreeDepth": (29.76, 31.70, 38.3),
    "TopConstituents": (69.82, 74.72, 84.2),
    "BigramShift": (78.08, 78.08, 88.3),
    "Tense": (85.97, 86.97, 89.0),
    "SubjNumber": (81.94, 84.72, 88.2),
    "ObjNumber": (75.42, 75.42, 83.4),
    "OddManOut": (59.58, 59.58, 65.1),
    "CoordinationInversion": (65.52, 65.87, 74.6),
    "SICKE": (61.92, 68.2, 78.9),
    "SST5 (paper only)": (46.38, 46.97, 46.0),
    "TREC (paper only)": (87.4, 87.4, 93.4),
}
# Their best single BERT-base head per probing task: (test acc %, layer, head), layer and head 0-based.
PAPER_BERT_BASE_HEAD = {
    "SentLen": (86.9, 0, 7),
    "WordContent": (50.3, 3, 6),
    "TreeDepth": (31.0, 0, 3),
    "TopConstituents": (71.3, 4, 11),
    "BigramShift": (83.6, 8, 8),
    "Tense": (87.9, 10, 0),
    "SubjNumber": (82.0, 5, 0),
    "ObjNumber": (76.8, 5, 10),
    "OddManOut": (60.0, 11, 1),
    "CoordinationInversion": (66.8, 7, 0),
}

RESULT_COLUMNS = [
    "model", "task", "kind", "layer", "head", "n", "metric", "dev", "test",
    "control_dev", "control_test", "selectivity", "l2", "epochs", "n_train", "n_dev", "n_test", "chance",
]  # fmt: skip


@dataclass
class TaskData:
    """One task's items as the probes see them (rows in table order, missing records dropped)."""

    split: np.ndarray  # [N] 'train' | 'dev' | 'test'
    y: np.ndarray  # [N] class index, or [N, C] soft targets (relatedness)
    control: np.ndarray | None  # [N] control class index
    n_control: int  # number of control classes
    classes: list[str]
    values: np.ndarray | None  # class values (relatedness) or None
    rows_a: np.ndarray  # [N] store positions of the (first) sentence
    rows_b: np.ndarray | None  # [N] store positions of the second sentence of a pair
    dropped: int

    @property
    def metric(self) -> str:
        return "accuracy" if self.values is None else "pearson"

    def mask(self, split: str) -> np.ndarray:
        return self.split == split


def task_data(
    items: pd.DataFrame, record_ids: Sequence[str], kind: str = "classification", score_range=(1.0, 5.0)
) -> TaskData:
    """Encode a task's items (columns split, label, and record or record_a/record_b, optional
    control) against the record ids of an attention store. Items whose records the store
    lacks (skipped as too long) are dropped and counted."""
    pos = {r: k for k, r in enumerate(record_ids)}
    a_col = "record" if "record" in items else "record_a"
    pair = "record_b" in items and (items["record_b"].astype(str) != "").any()
    ra = items[a_col].map(pos)
    rb = items["record_b"].map(pos) if pair else None
    ok = ra.notna() & (rb.notna() if pair else True)
    kept = items[ok.to_numpy()]
    bad = sorted(set(kept["split"]) - set(SPLITS))
    if bad:
        raise ValueError(f"unknown splits {bad}; expected {SPLITS}")
    for s in SPLITS:
        if not (kept["split"] == s).any():
            raise ValueError(
                f"no {s} item left (of {len(items)}; {int((~ok).sum())} records missing from the store: "
                "a corpus `limit`, or sequences longer than the model's max_length, drop records)"
            )
    if kind == "relatedness":
        y, values = relatedness_targets(kept["label"].astype(float).to_numpy(), *score_range)
        classes, control, n_control = [str(v) for v in values], None, 0
    else:
        classes = sorted(set(kept["label"]))
        index = {c: k for k, c in enumerate(classes)}
        y, values = kept["label"].map(index).to_numpy(np.int64), None
        control, n_control = None, 0
        if "control" in kept and (kept["control"] != "").all():
            cc = sorted(set(kept["control"]) | set(classes))
            cindex = {c: k for k, c in enumerate(cc)}
            control, n_control = kept["control"].map(cindex).to_numpy(np.int64), len(cc)
    return TaskData(
        split=kept["split"].to_numpy(),
        y=y,
        control=control,
        n_control=n_control,
        classes=classes,
        values=values,
        rows_a=ra[ok].to_numpy(np.int64),
        rows_b=rb[ok].to_numpy(np.int64) if pair else None,
        dropped=int((~ok).sum()),
    )


def read_features(store, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Head vectors [L, H, N, d] and layer hidden states [L, N, D] of the stored sequences
    ``rows``, one layer file at a time."""
    heads, layers = [], []
    for layer in range(store.n_layers):
        hv = store.head_vectors(layer)
        heads.append(np.ascontiguousarray(hv[rows].transpose(1, 0, 2)))
        layers.append(store.hidden(layer)[rows])
    return np.stack(heads), np.stack(layers)


def task_features(store, data: TaskData) -> tuple[np.ndarray, np.ndarray]:
    """Probe inputs of a task: per-head and per-layer vectors, or their pair features."""
    heads, layers = read_features(store, data.rows_a)
    if data.rows_b is None:
        return heads, layers
    hb, lb = read_features(store, data.rows_b)
    return pair_features(heads, hb), pair_features(layers, lb)


def _split(X: np.ndarray, data: TaskData, axis: int) -> dict[str, np.ndarray]:
    return {s: np.compress(data.mask(s), X, axis=axis) for s in SPLITS}


def _labels(y: np.ndarray, data: TaskData) -> dict[str, np.ndarray]:
    return {s: y[data.mask(s)] for s in SPLITS}


@dataclass(frozen=True, kw_only=True)
class TopNSettings(Settings):
    """analysis.jomyaeng top_n / n_curve (workflow/schemas/jomyaeng.schema.yaml): heads in the top-n probe
    (None: heads per layer, the paper; the config's 0) and the sizes of the top-n curve."""

    SECTION = "analysis.jomyaeng"
    CONVERT = {"top_n": lambda v: int(v) or None}  # the config's 0 is None

    top_n: int | None = None
    n_curve: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)


def curve_sizes(n_curve: Sequence[int], n_top: int, n_total: int) -> list[int]:
    return sorted({n for n in list(n_curve) + [n_top] if 1 <= n <= n_total})


def probe_task(
    heads: np.ndarray,
    layers: np.ndarray,
    data: TaskData,
    cfg: ProbeConfig,
    top: TopNSettings = TopNSettings(),
    model: str = "",
    task: str = "",
) -> pd.DataFrame:
    """All probes of one task: per head (with control), per layer, and top-n heads.

    ``heads`` [L, H, N, d], ``layers`` [L, N, D]; ``top.top_n`` defaults to H (the paper's n).
    Returns the tidy result table (RESULT_COLUMNS), kinds 'head', 'layer', 'topn'.
    """
    L, H, N, d = heads.shape
    n_top, n_curve = (H if top.top_n is None else top.top_n), top.n_curve
    n_classes = len(data.classes)
    flat = heads.reshape(L * H, N, d)
    y = _labels(data.y, data)
    counts = {f"n_{s}": int(data.mask(s).sum()) for s in SPLITS}
    if data.values is None:
        chance = float(np.bincount(y["test"], minlength=n_classes).max() / len(y["test"]))
    else:
        chance = 0.0
    base = dict(model=model, task=task, metric=data.metric, **counts, chance=chance)
    rows = []
    sizes = curve_sizes(n_curve, n_top, L * H)
    done = Progress(L * H * (1 + (data.control is not None)) + L + len(sizes), f"probes {model} {task}", "probes")

    res = train_probes(_split(flat, data, 1), y, cfg, n_classes, data.values)
    done.update(L * H)
    ctrl = None
    if data.control is not None:
        ctrl = train_probes(_split(flat, data, 1), _labels(data.control, data), cfg, data.n_control)
        done.update(L * H)
    for p in range(L * H):
        c_dev = ctrl.dev[p] if ctrl is not None else np.nan
        c_test = ctrl.test[p] if ctrl is not None else np.nan
        rows.append(
            dict(base, kind="head", layer=p // H, head=p % H, n=1, dev=res.dev[p], test=res.test[p],
                 control_dev=c_dev, control_test=c_test, selectivity=res.test[p] - c_test,
                 l2=res.l2[p], epochs=res.epochs[p])
        )  # fmt: skip

    lay = train_probes(_split(layers, data, 1), y, cfg, n_classes, data.values)
    done.update(L)
    for layer in range(L):
        rows.append(
            dict(
                base,
                kind="layer",
                layer=layer,
                head=-1,
                n=0,
                dev=lay.dev[layer],
                test=lay.test[layer],
                l2=lay.l2[layer],
                epochs=lay.epochs[layer],
            )
        )

    order = rank_heads(res.dev)
    for n in done.iter(sizes):
        top = top_n_features(flat, order, n)
        r = train_probes(_split(top, data, 0), y, cfg, n_classes, data.values)
        rows.append(
            dict(
                base, kind="topn", layer=-1, head=-1, n=n, dev=r.dev[0], test=r.test[0], l2=r.l2[0], epochs=r.epochs[0]
            )
        )
    out = pd.DataFrame(rows)
    return out.reindex(columns=RESULT_COLUMNS)


def rank_heads(dev: np.ndarray) -> np.ndarray:
    """Head indices by dev accuracy, best first (ties: lower layer, then lower head)."""
    return np.argsort(-np.asarray(dev), kind="stable")


def top_n_features(flat: np.ndarray, order: np.ndarray, n: int) -> np.ndarray:
    """The vectors of the n best heads concatenated in rank order: [N, n * d]."""
    sel = flat[order[:n]]  # [n, N, d]
    return np.ascontiguousarray(sel.transpose(1, 0, 2).reshape(sel.shape[1], -1))


# --- per-model tables ----------------------------------------------------------------


def head_table(results: pd.DataFrame) -> pd.DataFrame:
    """The tidy per-head table joined by the atlas: model, layer, head, task, dev_acc,
    test_acc, control_acc, selectivity (plus metric, L2, epochs)."""
    h = results[results["kind"] == "head"]
    out = pd.DataFrame(
        {
            "model": h["model"],
            "layer": h["layer"].astype(int),
            "head": h["head"].astype(int),
            "task": h["task"],
            "metric": h["metric"],
            "dev_acc": h["dev"],
            "test_acc": h["test"],
            "control_acc": h["control_test"],
            "selectivity": h["selectivity"],
            "l2": h["l2"],
            "epochs": h["epochs"].astype(int),
        }
    )
    return out.reset_index(drop=True)


def summary_table(results: pd.DataFrame, n_layers: int, n_heads: int, n_top: int | None = None) -> pd.DataFrame:
    """Per task: last layer, best layer (by dev; and by test as the paper's code chose),
    top-n heads, the best head, and where the information sits (relative depth 0..1)."""
    n_top = n_heads if n_top is None else n_top
    depth = max(n_layers - 1, 1)
    rows = []
    for task, g in results.groupby("task", sort=False):
        lay = g[g["kind"] == "layer"].sort_values("layer")
        hd = g[g["kind"] == "head"]
        tn = g[(g["kind"] == "topn") & (g["n"] == n_top)]
        by_dev = lay.iloc[int(np.argmax(lay["dev"].to_numpy()))]
        by_test = lay.iloc[int(np.argmax(lay["test"].to_numpy()))]
        order = rank_heads(hd["dev"].to_numpy())
        best = hd.iloc[order[0]]
        top = hd.iloc[order[:n_top]]
        topn = float(tn["test"].iloc[0]) if len(tn) else np.nan
        per_layer = hd.groupby("layer")["test"].max().reindex(range(n_layers))
        rows.append(
            {
                "model": g["model"].iloc[0],
                "task": task,
                "metric": g["metric"].iloc[0],
                "chance": g["chance"].iloc[0],
                "last_layer": float(lay["test"].iloc[-1]),
                "best_layer_dev": int(by_dev["layer"]),
                "best_layer": float(by_dev["test"]),
                "best_layer_test": int(by_test["layer"]),
                "best_layer_by_test": float(by_test["test"]),
                "n_top": n_top,
                "top_n": topn,
                "gain_vs_best_layer": topn - float(by_dev["test"]),
                "best_head": head_label(best["layer"], best["head"]),
                "best_head_test": float(best["test"]),
                "best_head_selectivity": float(best["selectivity"]),
                "best_head_depth": int(best["layer"]) / depth,
                "top_heads_depth": float(top["layer"].mean()) / depth,
                "peak_layer_depth": int(per_layer.to_numpy().argmax()) / depth,
                "mean_selectivity": float(hd["selectivity"].mean()),
            }
        )
    return pd.DataFrame(rows)


def category_scores(heads: pd.DataFrame) -> pd.DataFrame:
    """Per head: mean test accuracy over the surface, syntactic and semantic tasks present
    (Jo & Myaeng grouped them this way; their code summed the two surface tasks)."""
    wide = heads.pivot_table(index=["layer", "head"], columns="task", values="test_acc")
    out = pd.DataFrame(index=wide.index)
    for cat, tasks in CATEGORIES.items():
        have = [t for t in tasks if t in wide]
        if have:
            out[cat] = wide[have].mean(axis=1)
    return out.reset_index()


def task_correlation(heads: pd.DataFrame) -> pd.DataFrame:
    """Pearson correlation between tasks of their per-head test accuracies."""
    wide = heads.pivot_table(index=["layer", "head"], columns="task", values="test_acc")
    return wide.corr()


def with_paper(summary: pd.DataFrame) -> pd.DataFrame:
    """The cross-model summary with Jo & Myaeng's BERT-base numbers beside it, converted from the
    paper's percentages to fractions like every accuracy here."""
    paper = pd.DataFrame(
        [
            {"task": t, "paper_bert_base_last": v[0], "paper_bert_base_best": v[1], "paper_bert_base_top_n": v[2]}
            for t, v in PAPER_BERT_BASE.items()
        ]
    )
    cols = ["paper_bert_base_last", "paper_bert_base_best", "paper_bert_base_top_n"]
    paper[cols] = (paper[cols] / 100).round(4)
    heads = pd.DataFrame(
        [
            {"task": t, "paper_bert_base_best_head": f"{round(v[0] / 100, 4)} ({head_label(v[1], v[2])})"}
            for t, v in PAPER_BERT_BASE_HEAD.items()
        ]
    )
    return summary.merge(paper, on="task", how="outer").merge(heads, on="task", how="left")


def model_tables(results: pd.DataFrame, top: TopNSettings = TopNSettings()) -> dict[str, pd.DataFrame]:
    """Every table of rule jomyaeng_tables from one model's probe results (all tasks): heads,
    layers, topn and summary (``top.top_n``: heads in the top-n probe, None = heads per layer)."""
    heads = head_table(results)
    n_layers, n_heads = head_shape(heads)
    layers = results[results["kind"] == "layer"].drop(
        columns=["kind", "head", "n", "control_dev", "control_test", "selectivity"]
    )
    topn = results[results["kind"] == "topn"].drop(
        columns=["kind", "layer", "head", "control_dev", "control_test", "selectivity"]
    )
    return {
        "heads": heads,
        "layers": layers,
        "topn": topn,
        "summary": summary_table(results, n_layers, n_heads, top.top_n),
    }
