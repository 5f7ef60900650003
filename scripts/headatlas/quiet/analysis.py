"""Heads by what they do not do, per model: positional heads (Voita et al. 2019), dormant heads (output norm, and
the loss effect of zero-ablating the head), rigid and dynamic heads (entropy variance over sequences) and the
massive activations (Sun et al. 2024) joined to the sink heads (docs/quiet_heads.md).

Every per-head value is a mean over sequences of a per-sequence mean over its rows or tokens
(:mod:`headatlas.quiet.reducers`) with a percentile bootstrap CI over the sequences; the entropy variance is the
variance over sequences of each sequence's mean row entropy (ddof 1), its CI from the same resamples. The
zero-ablation runs the ablation package's batched exact head patching and its check
(:func:`headatlas.ablation.analysis.head_tables`, mode ``zero``) on the first natural inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from ..ablation.analysis import AblationSettings, head_tables, skipped_check
from ..ablation.tasks import token_evaluation
from ..core.batching import pad_token
from ..core.bootstrap import bootstrap_ci, resample_counts
from ..core.figures import head_label
from ..core.io import flags, head_shape
from ..core.models import decoder_bos, lm_head_model, model_kind, resolve
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
    ablation_sequences: int = 32
    exact_max_heads: int = 200
    exact_max_rows: int = 4096
    check_heads: int = 4
    check_seed: int = 0
    on_check_fail: str = "exact"
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0

    # keys read by one model-running rule only (sink_massive_share: by rule quiet_heads only); each rule's params
    # leave out the others', so changing a zero-ablation key reruns the zero-ablation and not the statistics
    ZERO_ABLATION_KEYS = ("ablation_sequences", "exact_max_heads", "exact_max_rows", "check_heads", "check_seed",
                          "on_check_fail")  # fmt: skip
    STATISTICS_KEYS = ("positional_share", "massive_threshold", "massive_ratio")

    @classmethod
    def rule_keys(cls, rule: str) -> tuple[str, ...]:
        """The config keys rule ``quiet`` or ``quiet_ablation`` reads."""
        other = {"quiet": cls.ZERO_ABLATION_KEYS, "quiet_ablation": cls.STATISTICS_KEYS}[rule]
        return tuple(f.name for f in fields(cls) if f.name not in other and f.name != "sink_massive_share")

    def __post_init__(self):
        if self.ablation_sequences == 1:
            raise ValueError("ablation_sequences: 0 (no zero-ablation) or at least 2 (a CI over sequences)")

    def ablation(self) -> AblationSettings:
        """The ablation settings of the zero-ablation: exact where affordable, else attribution patching checked
        per layer (as analysis.ablation)."""
        return AblationSettings(
            mode="zero", batch_size=self.batch_size, exact_max_heads=self.exact_max_heads,
            exact_max_rows=self.exact_max_rows, estimator="atp", compare_estimators=("atp",),
            check_heads=self.check_heads, check_seed=self.check_seed, on_check_fail=self.on_check_fail,
            bootstrap=self.bootstrap, ci=self.ci, seed=self.seed,
        )  # fmt: skip


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


# --- sinks after a massive activation (rule quiet_heads) ---------------------------------------------------------


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
    sink = flags(sink)
    massive = stats["quiet_massive_first"].to_numpy() >= settings.sink_massive_share
    out["quiet_sink_after_massive"] = pd.array(np.where(sink, massive, pd.NA), dtype="boolean")
    out["quiet_sink_after_massive_kind"] = EXACT
    return out


# --- dormant by zero-ablation (rule quiet_ablation) ---------------------------------------------------------------

ZERO_COLUMNS = ["model", "layer", "head", "label", "quiet_zero_effect", "quiet_zero_effect_ci_low",
                "quiet_zero_effect_ci_high", "quiet_zero_effect_kind", "quiet_zero_null", "quiet_zero_null_kind",
                "zero_method", "zero_intact_loss", "zero_sequences"]  # fmt: skip


def zero_table(heads: pd.DataFrame) -> pd.DataFrame:
    """The rule's zero_ablation.tsv from a loss head table of :func:`~headatlas.ablation.analysis.head_tables`
    (mode zero): per head ``quiet_zero_effect`` (loss with the head's output zeroed minus intact, nats) and its
    CI and kind; ``quiet_zero_null``: that CI holds 0 (dormant by zero-ablation), NA where there is no effect
    (unreliable, skipped), its kind the effect's."""
    h = heads[heads["metric"] == "loss"].sort_values(KEY).reset_index(drop=True)
    lo, hi = h["ci_low"].to_numpy(float), h["ci_high"].to_numpy(float)
    has = np.isfinite(h["effect"].to_numpy(float))
    out = h[["model", "layer", "head", "label"]].copy()
    out["quiet_zero_effect"], out["quiet_zero_effect_ci_low"], out["quiet_zero_effect_ci_high"] = h["effect"], lo, hi
    out["quiet_zero_effect_kind"] = h["kind"].to_numpy()
    out["quiet_zero_null"] = pd.array(np.where(has, (lo <= 0) & (hi >= 0), pd.NA), dtype="boolean")
    out["quiet_zero_null_kind"] = h["kind"].to_numpy()
    out["zero_method"], out["zero_intact_loss"], out["zero_sequences"] = h["method"], h["intact"], h["n_sequences"]
    return out[ZERO_COLUMNS]


def skipped_zero(model: str, n_layers: int, n_heads: int, reason: str) -> pd.DataFrame:
    """zero_ablation.tsv of a model the zero-ablation does not measure: the reason on every head."""
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    out = pd.DataFrame({"model": model, "layer": layer, "head": head,
                        "label": [head_label(a, b) for a, b in zip(layer, head)]}, columns=ZERO_COLUMNS)  # fmt: skip
    out["quiet_zero_null"] = pd.array([pd.NA] * len(out), dtype="boolean")
    out["quiet_zero_effect_kind"] = out["quiet_zero_null_kind"] = f"skipped: {reason}"
    out["zero_method"], out["zero_sequences"] = "skipped", 0
    return out


def zero_ablation(spec, cache_dir, corpora: dict, settings: QuietSettings, device: str):
    """Rule quiet_ablation: every head's output set to zero, one head at a time, on the first
    ``ablation_sequences`` natural inputs (:func:`natural_inputs`, corpus by corpus) of the model with its causal-LM
    head: the next-token loss effect per head and the check of the estimate (where the model has more heads than
    ``exact_max_heads`` on a CPU), from :func:`~headatlas.ablation.analysis.head_tables`. Returns (zero_table,
    check.tsv); a model it cannot measure gets the reason on every head."""
    from transformers import AutoConfig, AutoTokenizer

    s = settings
    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    shape = (int(config.num_hidden_layers), int(config.num_attention_heads))
    kind = model_kind(config, spec)
    model, reason = None, None
    if s.ablation_sequences == 0:
        reason = "analysis.quiet.ablation_sequences is 0"
    elif kind != "decoder":
        reason = "an encoder: the zero-ablation measures next-token loss, which needs a causal LM"
    else:
        model, reason = lm_head_model(loc, kind, kwargs, spec, device)  # on device, or split by its device_map
    if model is None:
        return skipped_zero(spec.name, *shape, reason), skipped_check(spec.name, "lm", reason)
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    tokenized, _ = natural_inputs(corpora, tokenizer, kind, decoder_bos(tokenizer, config, spec), s)
    tokenized = tokenized[: s.ablation_sequences]
    if len(tokenized) < 2:
        raise ValueError(f"model {spec.name}: {len(tokenized)} natural input(s) in corpora {list(corpora)}; need >= 2")
    ev = token_evaluation(model, tokenized, pad_token(tokenizer), s.batch_size, config)
    heads, check = head_tables(spec.name, ev, s.ablation())
    return zero_table(heads), check


# --- the join (rule quiet_heads) --------------------------------------------------------------------------------


def heads_table(
    stats: pd.DataFrame, detectors: pd.DataFrame | None, zero: pd.DataFrame | None, settings: QuietSettings
) -> pd.DataFrame:
    """The rule's heads.tsv: stats.tsv with the sink flags (:func:`sink_flags`) and the ``quiet_zero_*`` columns of
    zero_ablation.tsv (:func:`zero_table`; None: the zero-ablation was not run, every head skipped)."""
    if zero is None:
        n_layers, n_heads = head_shape(stats)
        zero = skipped_zero(str(stats["model"].iloc[0]), n_layers, n_heads, "no zero-ablation table")
    cols = KEY + [c for c in zero.columns if c.startswith("quiet_zero_")]
    z = stats[KEY].merge(zero[cols], on=KEY, how="left", validate="one_to_one")
    if z["quiet_zero_effect_kind"].isna().any():
        raise ValueError("zero_ablation.tsv: no row for some heads of stats.tsv; rebuild it")
    z["quiet_zero_null"] = z["quiet_zero_null"].astype("boolean")
    return stats.merge(sink_flags(stats, detectors, settings), on=KEY).merge(z, on=KEY)


def summary_table(heads: pd.DataFrame, settings: QuietSettings, zero: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per model: how many heads are positional, dormant by zero-ablation (the loss effect's CI holds 0;
    the share of the heads ablated exactly, and apart the checked estimates) and sinks after a massive activation,
    and the spread of the output norms and entropy variances. ``zero``: zero_ablation.tsv, for its sequences and
    intact loss."""
    rows = []
    for model, h in heads.groupby("model", sort=False):
        kind = h["quiet_zero_effect_kind"].astype(str)
        null = h["quiet_zero_null"].astype("boolean")
        exact = (kind == EXACT).to_numpy()
        est = (kind == "estimated (checked)").to_numpy()
        n_exact = int(exact.sum())
        z = zero[zero["model"] == model] if zero is not None else None
        sink = h["quiet_sink_after_massive"].dropna().astype(bool)
        rows.append(
            {
                "model": model, "n_heads": len(h), "n_sequences": int(h["n_sequences"].iloc[0]),
                "positional_threshold": settings.positional_share,
                "positional_heads": int(h["quiet_positional_head"].sum()),
                "positional_prev_heads": int((h["quiet_positional_head"] & (h["quiet_positional_offset"] == -1)).sum()),
                "mean_max_weight": float(h["quiet_max_weight"].mean()),
                "norm_rel_min": float(h["quiet_norm_rel"].min()), "norm_rel_median": float(h["quiet_norm_rel"].median()),
                "zero_sequences": int(z["zero_sequences"].max()) if z is not None and len(z) else 0,
                "zero_intact_loss": float(z["zero_intact_loss"].mean()) if z is not None and len(z) else np.nan,
                "zero_exact_heads": n_exact, "zero_null_exact_heads": int(null[exact].sum()),
                "zero_null_share": float(null[exact].mean()) if n_exact else np.nan,
                "zero_estimated_heads": int(est.sum()), "zero_null_estimated_heads": int(null[est].sum()),
                "zero_unreliable_heads": int((kind == "unreliable").sum()),
                "entropy_var_median": float(h["quiet_entropy_var"].median()),
                "entropy_var_max": float(h["quiet_entropy_var"].max()),
                "massive_layers": int((h.groupby("layer")["quiet_massive_first"].first() > 0).sum()),
                "sink_heads": len(sink), "sink_after_massive_heads": int(sink.sum()),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)
