"""Per-head detector tables: bootstrap CIs over sequences, the test against the shuffled-position null with
FDR control, the attention-sink shares beside Gu et al.'s Table 1, and the key/value-group summary.

Test (per head, detector and input kind): the paired per-sequence differences d = score - null score
(:mod:`headatlas.detectors.reducers`), one-sided one-sample t-test of mean d > 0 (scipy, ddof 1); a head whose
differences are all equal gets p = 0 when they are positive, else 1. The family of one model is every head x
detector x input kind with a p-value, adjusted with :func:`headatlas.core.multitest.adjust` (the Pande
analysis's FDR function; Benjamini-Hochberg by default).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from ..core.batching import pad_token
from ..core.bootstrap import bootstrap_ci
from ..core.io import head_shape
from ..core.models import architecture, decoder_bos, model_kind
from ..core.multitest import adjust
from ..core.reduce import fused_reduce
from .reducers import DetectorReducer
from .registry import REGISTRY, column
from .sequences import (
    INPUT_KINDS,
    DetectorSettings,
    LongDetectorSettings,
    inputs_table,
    long_settings,
    n_framing,
    natural_inputs,
    random_inputs,
)

HEAD_COLUMNS = [
    "model", "layer", "head", "kv_group", "input", "detector", "n", "mean", "ci_low", "ci_high", "null_mean",
    "effect", "statistic", "p", "p_adj", "significant", "threshold", "above_threshold", "main",
]  # fmt: skip
# Gu et al. 2025, Table 1: Sink_1 at epsilon 0.3, T = 64, in percent (natural / random / repeated tokens)
GU_TABLE1 = {
    "GPT2-XL": (77.00, 70.29, 62.28),
    "Mistral-7B": (97.49, 75.21, 0.00),
    "Llama-2-7B": (92.47, 90.13, 0.00),
    "Llama-3-8B": (99.02, 91.23, 0.00),
}


def kv_groups(n_heads: int, n_kv: int) -> np.ndarray:
    """The key/value head each query head reads (transformers' repeat_kv: head // (n_heads / n_kv))."""
    if n_kv <= 0 or n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    return np.arange(n_heads) // (n_heads // n_kv)


def one_sided_p(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(t, p) of mean > 0 per column of d [N, C] (complete); constant columns: p 0 if positive else 1."""
    if len(d) < 2:
        nan = np.full(d.shape[1], np.nan)
        return nan, nan.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.ttest_1samp(d, 0.0, alternative="greater", axis=0)
    t, p = np.asarray(res.statistic, dtype=float), np.asarray(res.pvalue, dtype=float)
    flat = np.ptp(d, axis=0) <= 1e-12 * np.maximum(1.0, np.abs(d).max(0))
    p = np.where(flat, np.where(d.mean(0) > 0, 0.0, 1.0), p)
    t = np.where(flat, np.where(d.mean(0) > 0, np.inf, np.nan), t)
    return t, p


def head_table(
    result: dict, inputs: list[str], model: str, n_kv: int, settings: DetectorSettings = DetectorSettings()
) -> pd.DataFrame:
    """One row per head x input kind x detector (columns :data:`HEAD_COLUMNS`). ``result``: the reducer's
    ``scores`` / ``null`` [N, L, H, D]; ``inputs``: the input kind of each of the N sequences."""
    s = settings
    x, x0 = result["scores"], result["null"]
    n_seq, n_layers, n_heads, _ = x.shape
    inputs = np.asarray(inputs)
    if len(inputs) != n_seq:
        raise ValueError(f"{len(inputs)} input kinds for {n_seq} sequences")
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    group = kv_groups(n_heads, n_kv)[head]
    frames = []
    for ki, kind in enumerate(k for k in INPUT_KINDS if k in set(inputs)):
        for d, det in enumerate(REGISTRY):
            v = x[inputs == kind, :, :, d].reshape(-1, n_layers * n_heads)
            v0 = x0[inputs == kind, :, :, d].reshape(-1, n_layers * n_heads)
            rows = ~np.isnan(v).any(1)
            v, v0 = v[rows], v0[rows]
            nan = np.full(n_layers * n_heads, np.nan)
            mean, null = (v.mean(0), v0.mean(0)) if len(v) else (nan, nan)
            lo, hi = bootstrap_ci(v, n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, ki, d]))
            if not len(v):
                lo, hi = nan, nan
            t, p = one_sided_p(v - v0)
            thr = s.sink_epsilon if det == "sink" else np.nan
            frames.append(
                pd.DataFrame(
                    {
                        "model": model,
                        "layer": layer,
                        "head": head,
                        "kv_group": group,
                        "input": kind,
                        "detector": det,
                        "n": int(len(v)),
                        "mean": mean,
                        "ci_low": lo,
                        "ci_high": hi,
                        "null_mean": null,
                        "effect": mean - null,
                        "statistic": t,
                        "p": p,
                        "threshold": thr,
                        "above_threshold": (mean > thr) if det == "sink" else False,
                    }
                )  # fmt: skip
            )
    out = pd.concat(frames, ignore_index=True)
    out["p_adj"], out["significant"] = adjust(out["p"].to_numpy(), s.alpha, s.fdr_method)
    out["main"] = [
        REGISTRY[d].main_input == i for d, i in zip(out["detector"], out["input"])
    ]  # the atlas reads these rows
    return out[HEAD_COLUMNS]


def sink_table(result: dict, inputs: list[str], model: str, epsilon: float) -> pd.DataFrame:
    """Per input kind, per layer and for the whole model ('all'): the share of sink heads, as fractions.

    ``sink_head_share``: heads whose mean alpha_1 over the sequences exceeds ``epsilon``;
    ``sink_share_gu``: Gu et al.'s Sink_1, the share of (sequence, head) pairs with alpha_1 > epsilon
    (their Table 1 reports it in percent)."""
    alpha = result["scores"][..., column("sink")]  # [N, L, H]
    inputs = np.asarray(inputs)
    rows = []
    for kind in (k for k in INPUT_KINDS if k in set(inputs)):
        a = alpha[inputs == kind]
        head_sink = a.mean(0) > epsilon  # [L, H]
        pair = a > epsilon
        for layer in [*range(a.shape[1]), "all"]:
            sel = slice(None) if layer == "all" else layer
            rows.append(
                {
                    "model": model, "input": kind, "layer": layer, "n_sequences": len(a),
                    "n_heads": int(head_sink[sel].size), "epsilon": epsilon,
                    "sink_head_share": float(head_sink[sel].mean()), "sink_share_gu": float(pair[:, sel].mean()),
                    "mean_alpha1": float(a[:, sel].mean()),
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def group_agreement(sig: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Share of (layer, group) cells whose heads are all or none significant; ``sig`` [..., L, H] booleans,
    ``groups`` [H] the group of each head."""
    size = np.bincount(groups)
    counts = np.stack([sig[..., groups == k].sum(-1) for k in range(len(size))], -1)
    return ((counts == 0) | (counts == size)).mean((-1, -2))


def kv_group_tables(
    heads: pd.DataFrame, n_permutations: int = 1000, seed: int = 0, strong: float = 0.3
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per layer x KV group x detector, per detector) summaries on each detector's main input: do the query
    heads of one key/value group share roles? A head has a role when it is significant (FDR), and strongly when
    its mean score also exceeds ``strong``; a group *agrees* when all or none of its heads have the role. The
    summary compares the share of agreeing (layer, group) cells with its distribution when the heads of each
    layer are shuffled among its groups (``n_permutations``, seeded): ``p_perm`` = P(shuffled >= observed); the
    same for strong roles (``*_strong``). NA for a model with one head per group."""
    main = heads[heads["main"]].assign(strong=lambda t: t["significant"] & (t["mean"] > strong))
    g = main.groupby(["model", "layer", "kv_group", "detector"], sort=False)
    per = g.agg(
        n_heads=("head", "size"),
        heads=("head", lambda h: " ".join(str(int(v)) for v in h)),
        n_significant=("significant", "sum"),
        n_strong=("strong", "sum"),
        mean_min=("mean", "min"),
        mean_max=("mean", "max"),
    ).reset_index()
    per["agrees"] = (per["n_significant"] == 0) | (per["n_significant"] == per["n_heads"])
    per["agrees_strong"] = (per["n_strong"] == 0) | (per["n_strong"] == per["n_heads"])
    per["mean_spread"] = per["mean_max"] - per["mean_min"]
    rng = np.random.default_rng(seed)
    summary = []
    for (model, det), m in main.groupby(["model", "detector"], sort=False):
        m = m.sort_values(["layer", "head"])
        n_layers, n_heads = head_shape(m)
        grp = m["kv_group"].to_numpy().reshape(n_layers, n_heads)[0]
        n_groups = int(grp.max()) + 1
        trivial = n_permutations == 0 or n_groups == n_heads  # one head per group: nothing to share
        perm = np.argsort(rng.random((n_permutations, n_layers, n_heads)), -1)
        row = {"model": model, "detector": det, "input": REGISTRY[det].main_input, "n_groups": n_layers * n_groups,
               "group_size": n_heads // n_groups}  # fmt: skip
        for col, tag in (("significant", ""), ("strong", "_strong")):
            sig = m[col].to_numpy(bool).reshape(n_layers, n_heads)
            obs = float(group_agreement(sig, grp))
            null = group_agreement(np.take_along_axis(np.broadcast_to(sig, perm.shape), perm, -1), grp)
            row[f"{'significant' if not tag else 'strong'}_heads"] = int(sig.sum())
            row[f"agree_share{tag}"] = obs
            row[f"agree_share_shuffled{tag}"] = np.nan if trivial else float(np.mean(null))
            row[f"p_perm{tag}"] = np.nan if trivial else float((1 + (null >= obs - 1e-12).sum()) / (1 + len(null)))
        summary.append(row)
    return per.drop(columns=["mean_min", "mean_max"]), pd.DataFrame(summary)


def run_detectors(
    spec, model, tokenizer, config, corpora: dict, settings: DetectorSettings, long: LongDetectorSettings | None = None
) -> dict:
    """Every table of rule detectors for one loaded model (:func:`headatlas.core.models.load`): build the
    inputs (``corpora``: name -> records of the natural corpora), reduce them fused (map-free where the model
    allows: :func:`~headatlas.core.mapfree.plan_feed`), test and summarise. ``long``: the inputs of rule
    detectors_long, ``spec.max_length`` tokens each (:func:`~headatlas.detectors.sequences.long_settings`).
    Returns frames ``inputs``, ``heads``, ``sinks``, ``kv_groups``, ``kv_summary``."""
    kind = model_kind(config, spec)
    bos = decoder_bos(tokenizer, config, spec)
    s = settings if long is None else long_settings(settings, long, spec.max_length, n_framing(kind, bos))
    tokenized, kinds, sources = [], [], []
    for name, records in corpora.items():
        t, ids = natural_inputs(records, tokenizer, kind, bos, s, len(tokenized))
        tokenized += t
        kinds += ["natural"] * len(t)
        sources += [f"{name}:{i}" for i in ids]
    t, k = random_inputs(tokenizer, kind, bos, s, spec.max_length, len(tokenized), spec.name)
    sources += [f"seed {s.seed}"] * len(t)
    tokenized += t
    kinds += k
    n_kv = architecture(config.model_type, spec.name).kv_heads(config)
    pad_id = pad_token(tokenizer)
    record_id = [f"{k}:{i}" for i, k in enumerate(kinds)]
    result = fused_reduce(
        model, tokenized, [DetectorReducer(s.seed)], s.batch_size, kind, None, pad_id, spec.name, "detectors", record_id
    )[0]
    heads = head_table(result, kinds, spec.name, n_kv, s)
    per, summary = kv_group_tables(heads, seed=s.seed, strong=s.sink_epsilon)
    return {
        "inputs": inputs_table(tokenized, kinds, sources),
        "heads": heads,
        "sinks": sink_table(result, kinds, spec.name, s.sink_epsilon),
        "kv_groups": per,
        "kv_summary": summary,
    }


def sinks_by_model(sinks: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per model (the 'all' rows of each sinks.tsv) and one per model of Gu et al.'s Table 1: Sink_1 as a
    fraction (theirs divided by 100) per input kind. ``source`` says where a row comes from; Gu et al. have no
    ``repeated`` (repeated random sequence) column and their repeated tokens are not framed by a BOS."""
    rows = []
    for s in sinks:
        a = s[s["layer"].astype(str) == "all"]
        for model, m in a.groupby("model", sort=False):
            row = {"model": model, "source": "headatlas", "epsilon": float(m["epsilon"].iloc[0])}
            row.update({f"{k}_sink_share": float(v) for k, v in zip(m["input"], m["sink_share_gu"])})
            row.update({f"{k}_sink_head_share": float(v) for k, v in zip(m["input"], m["sink_head_share"])})
            rows.append(row)
    for model, (nat, rnd, rep) in GU_TABLE1.items():
        rows.append(
            {
                "model": model, "source": "Gu et al. 2025 Table 1 (T = 64)", "epsilon": 0.3,
                "natural_sink_share": nat / 100, "random_sink_share": rnd / 100, "repeated_token_sink_share": rep / 100,
            }
        )  # fmt: skip
    cols = ["model", "source", "epsilon"] + [f"{k}_{v}" for v in ("sink_share", "sink_head_share") for k in INPUT_KINDS]
    return pd.DataFrame(rows).reindex(columns=cols)
