"""Heads by what they do not do, per model: positional heads (Voita et al. 2019), dormant heads (output norm, and
zero effect of the exact ablation), rigid and dynamic heads (entropy variance over sequences) and the massive
activations (Sun et al. 2024) joined to the sink heads (docs/quiet_heads.md).

Every per-head value is a mean over sequences of a per-sequence mean over its rows or tokens
(:mod:`headatlas.quiet.reducers`) with a percentile bootstrap CI over the sequences; the entropy variance is the
variance over sequences of each sequence's mean row entropy (ddof 1), its CI from the same resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.batching import pad_token
from ..core.bootstrap import bootstrap_ci, resample_counts
from ..core.figures import head_label
from ..core.models import decoder_bos, model_kind
from ..core.reduce import fused_reduce
from ..core.settings import Settings
from ..detectors.sequences import natural_inputs as first_records
from .reducers import HIT_COLUMNS, ROW_STATS, ActivityReducer, RowMaxReducer

KEY = ["layer", "head"]
EXACT = "exact"


@dataclass(frozen=True, kw_only=True)
class QuietSettings(Settings):
    """analysis.quiet (workflow/schemas/quiet.schema.yaml)."""

    SECTION = "analysis.quiet"

    n_sequences: int = 64
    length: int = 64
    batch_size: int = 16
    positional_share: float = 0.9
    massive_threshold: float = 100.0
    massive_ratio: float = 1000.0
    sink_massive_share: float = 0.5
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0


def natural_inputs(records_by_corpus: dict, tokenizer, kind: str, bos, settings: QuietSettings):
    """The first ``n_sequences`` records of each corpus cut to ``length`` tokens (the detectors' natural inputs, the
    same text the sink column was measured on when the corpora and lengths agree), and their ``corpus:id``."""
    tokenized, sources = [], []
    for name, records in records_by_corpus.items():
        t, ids = first_records(records, tokenizer, kind, bos, settings, len(tokenized))
        tokenized += t
        sources += [f"{name}:{i}" for i in ids]
    return tokenized, sources


def run_quiet(spec, model, tokenizer, config, corpora: dict, settings: QuietSettings) -> dict:
    """Every table of rule quiet for one loaded model (:func:`headatlas.core.models.load`): reduce the natural
    inputs fused (map-free where the model allows) and summarise. Returns frames ``stats`` (per head),
    ``massive`` (per layer, channel and token) and ``layers`` (per layer)."""
    s = settings
    kind = model_kind(config, spec)
    tokenized, sources = natural_inputs(corpora, tokenizer, kind, decoder_bos(tokenizer, config, spec), s)
    if len(tokenized) < 2:
        raise ValueError(f"model {spec.name}: {len(tokenized)} natural input(s) in corpora {list(corpora)}; need >= 2")
    reducers = [RowMaxReducer(), ActivityReducer(model, s.massive_threshold, s.massive_ratio)]
    rows, activity = fused_reduce(
        model, tokenized, reducers, s.batch_size, kind, None, pad_token(tokenizer), spec.name, "quiet", sources
    )
    return {
        "stats": head_stats(rows["stats"], activity, spec.name, s),
        "massive": massive_table(activity["hits"], len(tokenized), spec.name),
        "layers": layer_table(activity, spec.name, s),
    }


def variance_ci(x: np.ndarray, counts: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(variance over rows, ddof 1; CI low, high) of every column of ``x`` [N, C], the CI from the bootstrap
    ``counts`` [B, N] (:func:`~headatlas.core.bootstrap.resample_counts`): one matrix product per moment."""
    n = len(x)
    var = x.var(0, ddof=1) if n > 1 else np.full(x.shape[1], np.nan)
    if not len(counts) or n < 2:
        nan = np.full(x.shape[1], np.nan)
        return var, nan, nan.copy()
    m1, m2 = counts @ x / n, counts @ (x * x) / n
    boot = np.maximum(m2 - m1 * m1, 0) * n / (n - 1)
    a = (1 - level) / 2
    return var, np.quantile(boot, a, axis=0), np.quantile(boot, 1 - a, axis=0)


def head_stats(stats: np.ndarray, activity: dict, model: str, settings: QuietSettings) -> pd.DataFrame:
    """One row per head: the ``quiet_*`` columns of the rule's stats.tsv (docs/quiet_heads.md). ``stats``
    [N, L, H, 4] (:data:`~headatlas.quiet.reducers.ROW_STATS`), ``activity`` the
    :class:`~headatlas.quiet.reducers.ActivityReducer` result."""
    s = settings
    n_seq, n_layers, n_heads, _ = stats.shape
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    out = pd.DataFrame(
        {"model": model, "layer": layer, "head": head, "label": [head_label(a, b) for a, b in zip(layer, head)]}
    )
    out["n_sequences"] = n_seq
    values = {name: stats[..., k].reshape(n_seq, -1) for k, name in enumerate(ROW_STATS)}
    values["norm"] = activity["norm"].reshape(n_seq, -1)
    for j, name in enumerate(("prev", "next", "max_weight", "entropy", "norm")):
        v = values[name]
        col = f"quiet_{name}"
        if np.isnan(v).all():  # a decoder's +1 offset: no row has that key
            out[col] = out[col + "_ci_low"] = out[col + "_ci_high"] = np.nan
            continue
        lo, hi = bootstrap_ci(v, n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, j]))
        out[col], out[col + "_ci_low"], out[col + "_ci_high"] = v.mean(0), lo, hi
    share = np.fmax(out["quiet_prev"].to_numpy(), out["quiet_next"].to_numpy())
    out["quiet_positional"] = share
    out["quiet_positional_offset"] = np.where(
        np.isnan(share), np.nan, np.where(out["quiet_prev"].fillna(-1) >= out["quiet_next"].fillna(-1), -1, 1)
    )
    out["quiet_positional_head"] = share >= s.positional_share
    norm = out["quiet_norm"].to_numpy().reshape(n_layers, n_heads)
    out["quiet_norm_rel"] = (norm / norm.mean(1, keepdims=True)).ravel()
    counts = resample_counts(np.random.default_rng([s.seed, 5]), n_seq, s.bootstrap)
    var, lo, hi = variance_ci(values["entropy"], counts, s.ci)
    out["quiet_entropy_var"], out["quiet_entropy_var_ci_low"], out["quiet_entropy_var_ci_high"] = var, lo, hi
    out["quiet_massive_first"] = np.repeat(activity["first"].mean(0), n_heads)
    return out


def massive_table(hits: pd.DataFrame, n_sequences: int, model: str) -> pd.DataFrame:
    """One row per (layer, channel, token) of the massive cells: ``token`` is ``first`` at position 0, else the
    token's piece; the sequences it occurs in (count and share), its positions, the mean and largest |value|, the
    sign of the mean value and the median |x| of those hidden states."""
    cols = [
        "model",
        "layer",
        "channel",
        "token",
        "n_sequences",
        "share",
        "positions",
        "mean_value",
        "max_abs",
        "median",
    ]
    if not len(hits):
        return pd.DataFrame(columns=cols)
    h = hits[HIT_COLUMNS].assign(token=np.where(hits["token"] == 0, "first", hits["piece"].astype(str)))
    h["position"], h["abs"] = hits["token"], hits["value"].abs()
    g = h.groupby(["layer", "channel", "token"], sort=True)
    out = g.agg(
        n_sequences=("sequence", "nunique"),
        positions=("position", lambda p: " ".join(str(v) for v in sorted(set(p))[:10])),
        mean_value=("value", "mean"),
        max_abs=("abs", "max"),
        median=("median", "mean"),
    ).reset_index()
    out["share"] = out["n_sequences"] / n_sequences
    out.insert(0, "model", model)
    return out.sort_values(["layer", "max_abs"], ascending=[True, False])[cols].reset_index(drop=True)


def layer_table(activity: dict, model: str, settings: QuietSettings) -> pd.DataFrame:
    """Per layer (its input, the residual stream): the mean top |x| and median |x| over sequences, their ratio, the
    share of sequences with a massive activation anywhere and at the first token, and its channels."""
    hits = activity["hits"]
    n_seq, n_layers = activity["top"].shape
    any_hit = np.zeros((n_seq, n_layers), dtype=bool)
    if len(hits):
        any_hit[hits["sequence"].to_numpy(), hits["layer"].to_numpy()] = True
    channels = [
        " ".join(str(c) for c in sorted(set(hits.loc[hits["layer"] == la, "channel"]))[:10]) if len(hits) else ""
        for la in range(n_layers)
    ]
    top, med = activity["top"], activity["median"]
    return pd.DataFrame(
        {
            "model": model,
            "layer": np.arange(n_layers),
            "n_sequences": n_seq,
            "top_abs": top.mean(0),
            "median_abs": med.mean(0),
            "ratio": (top / med).mean(0),
            "massive_share": any_hit.mean(0),
            "massive_first_share": activity["first"].mean(0),
            "channels": channels,
            "threshold": settings.massive_threshold,
            "min_ratio": settings.massive_ratio,
        }
    )


# --- the join with the detectors and the ablation (rule quiet_heads) ---------------------------------------------


def sink_flags(stats: pd.DataFrame, detectors: pd.DataFrame | None, settings: QuietSettings) -> pd.DataFrame:
    """``quiet_sink_after_massive``: the head is a sink head of the detectors (mean alpha_1 on natural text above
    their epsilon: heads.tsv ``above_threshold``) and the residual stream entering its layer holds a massive
    activation at the first token in at least ``sink_massive_share`` of the sequences; False for a sink head
    without one, NA for a head that is no sink head. Its kind: exact, or skipped when the detectors do not
    cover the model."""
    out = stats[KEY].copy()
    if detectors is None:
        out["quiet_sink_after_massive"] = pd.NA
        out["quiet_sink_after_massive_kind"] = "skipped: the detectors do not cover this model"
        return out
    d = detectors[(detectors["detector"] == "sink") & (detectors["input"] == "natural")]
    sink = stats[KEY].merge(d[KEY + ["above_threshold"]], on=KEY, how="left")["above_threshold"]
    if sink.isna().any():
        raise ValueError("detectors heads.tsv: no natural-text sink row for some heads; rebuild it")
    sink = sink.map(lambda v: str(v) == "True").to_numpy()
    massive = stats["quiet_massive_first"].to_numpy() >= settings.sink_massive_share
    out["quiet_sink_after_massive"] = pd.array(np.where(sink, massive, pd.NA), dtype="boolean")
    out["quiet_sink_after_massive_kind"] = EXACT
    return out


def ablation_flags(stats: pd.DataFrame, ablation: pd.DataFrame | None) -> pd.DataFrame:
    """``quiet_ablation_null``: the head's exact ablation changes the loss by less than its CI (the CI of the
    loss effect holds 0), for heads with an exact loss effect in the ablation's heads.tsv (its first loss task);
    NA elsewhere, the kind says why. ``quiet_ablation_mode``: the ablation's mode (zero, mean or resample)."""
    out = stats[KEY].copy()
    if ablation is None:
        out["quiet_ablation_null"], out["quiet_ablation_mode"] = pd.NA, ""
        out["quiet_ablation_null_kind"] = "skipped: the ablation does not cover this model"
        return out
    loss = ablation[(ablation["metric"] == "loss") & (ablation["status"] == "ok")]
    if not len(loss):
        why = ablation.loc[ablation["metric"] == "loss", "reason"].dropna().astype(str)
        out["quiet_ablation_null"], out["quiet_ablation_mode"] = pd.NA, ""
        out["quiet_ablation_null_kind"] = "skipped: " + (why.iloc[0] if len(why) else "no loss effect in the ablation")
        return out
    loss = loss[loss["task"] == loss["task"].iloc[0]]
    m = stats[KEY].merge(loss[KEY + ["exact", "exact_ci_low", "exact_ci_high", "mode"]], on=KEY, how="left")
    has = m["exact"].notna().to_numpy()
    null = (m["exact_ci_low"] <= 0) & (m["exact_ci_high"] >= 0)
    out["quiet_ablation_null"] = pd.array(np.where(has, null, pd.NA), dtype="boolean")
    out["quiet_ablation_mode"] = m["mode"].fillna("").astype(str).to_numpy()
    out["quiet_ablation_null_kind"] = np.where(has, EXACT, "skipped: no exact ablation of this head")
    return out


def heads_table(
    stats: pd.DataFrame, detectors: pd.DataFrame | None, ablation: pd.DataFrame | None, settings: QuietSettings
) -> pd.DataFrame:
    """The rule's heads.tsv: stats.tsv with the sink and ablation flags (:func:`sink_flags`, :func:`ablation_flags`)."""
    return stats.merge(sink_flags(stats, detectors, settings), on=KEY).merge(ablation_flags(stats, ablation), on=KEY)


def summary_table(heads: pd.DataFrame, settings: QuietSettings) -> pd.DataFrame:
    """One row per model: how many heads are positional, dormant by ablation (CI holds 0, of those exactly
    ablated) and sinks after a massive activation, and the spread of the output norms and entropy variances."""
    rows = []
    for model, h in heads.groupby("model", sort=False):
        null = h["quiet_ablation_null"].dropna().astype(bool)
        sink = h["quiet_sink_after_massive"].dropna().astype(bool)
        rows.append(
            {
                "model": model, "n_heads": len(h), "n_sequences": int(h["n_sequences"].iloc[0]),
                "positional_threshold": settings.positional_share,
                "positional_heads": int(h["quiet_positional_head"].sum()),
                "positional_prev_heads": int((h["quiet_positional_head"] & (h["quiet_positional_offset"] == -1)).sum()),
                "mean_max_weight": float(h["quiet_max_weight"].mean()),
                "norm_rel_min": float(h["quiet_norm_rel"].min()), "norm_rel_median": float(h["quiet_norm_rel"].median()),
                "ablation_mode": next((m for m in h["quiet_ablation_mode"] if m), ""),
                "ablation_exact_heads": len(null), "ablation_null_heads": int(null.sum()),
                "ablation_null_share": float(null.mean()) if len(null) else np.nan,
                "entropy_var_median": float(h["quiet_entropy_var"].median()),
                "entropy_var_max": float(h["quiet_entropy_var"].max()),
                "massive_layers": int((h.groupby("layer")["quiet_massive_first"].first() > 0).sum()),
                "sink_heads": len(sink), "sink_after_massive_heads": int(sink.sum()),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)
