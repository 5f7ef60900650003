"""Per-head hypothesis tests of Pande et al. 2021 (shared methods §1.4), and a rigorous companion.

Faithful (the reference code): for each head x role, a one-sided one-sample t-test of
H0: mean <= tau against H1: mean > tau on the sentence scores, with the population standard
deviation (ddof 0), df = n - 1, tau = 3, alpha = 0.05 and no correction for the many tests.

Rigorous (reported alongside, not in the paper):
- Benjamini-Hochberg (or any ``statsmodels`` ``multipletests`` method, always passed
  explicitly) over the whole family of heads x roles of one model;
- the effect size mean / tau with a seeded percentile bootstrap CI over sentences;
- optionally a seeded sign-flip permutation test of the same hypothesis (null: the scores are
  symmetric about tau) or a one-sided Wilcoxon signed-rank test, also FDR-adjusted.

Stability (not in the paper): the sieve score grows with the sequence length n, so a pooled test
is dominated by the corpus with the longest inputs. Each label therefore carries the share of
seeded bootstrap resamples (sentences resampled within each corpus) in which it holds, and the
share of corpora in which the per-corpus test gives it (:func:`stability_shares`,
:func:`corpus_shares`).

Everything is vectorised over heads: a role's heads share the same sentences (a sentence
enters a role when it has a query, or a pair, for it), so one resampling matrix serves all.
"""

from __future__ import annotations

import logging
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.bootstrap import bootstrap_ci, resample_counts
from ..core.multitest import adjust
from ..core.progress import progress
from ..core.settings import Settings

log = logging.getLogger("headatlas.pande.hypothesis")

NONPARAMETRIC = ("none", "sign_flip", "wilcoxon")
COLUMNS = [
    "model", "layer", "head", "role", "n", "mean", "sd", "ci_low", "ci_high", "effect", "effect_ci_low",
    "effect_ci_high", "tau", "statistic", "df", "p", "p_adj", "p_nonparam", "p_nonparam_adj",
    "significant_faithful", "significant_fdr", "significant_nonparam_fdr", "note",
]  # fmt: skip
# appended to the pooled table (after COLUMNS): bootstrap and per-corpus stability of each label
STABILITY_COLUMNS = [
    "stability_faithful",
    "stability_fdr",
    "corpus_share_faithful",
    "corpus_share_fdr",
    "corpora_tested",
]


@dataclass(frozen=True, kw_only=True)
class HypothesisSettings(Settings):
    """The test keys of analysis.pande (workflow/schemas/pande.schema.yaml) rule pande_test reads."""

    SECTION = "analysis.pande"

    tau: float = 3.0
    alpha: float = 0.05
    ddof: int = 0
    fdr_method: str = "fdr_bh"
    bootstrap: int = 1000
    ci: float = 0.95
    nonparametric: str = "sign_flip"
    permutations: int = 1000
    seed: int = 0
    stability_resamples: int = 200

    def __post_init__(self):
        if self.ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 (reference code) or 1 (scipy), not {self.ddof}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), not {self.alpha}")
        if not 0 < self.ci < 1:
            raise ValueError(f"ci must lie in (0, 1), not {self.ci}")
        if self.nonparametric not in NONPARAMETRIC:
            raise ValueError(f"nonparametric must be one of {NONPARAMETRIC}, not {self.nonparametric!r}")
        if self.stability_resamples < 0:
            raise ValueError(f"stability_resamples must be >= 0, not {self.stability_resamples}")


def one_sided_t(x: np.ndarray, tau: float, ddof: int = 0) -> dict[str, np.ndarray]:
    """One-sided one-sample t-test of H0 mean <= tau per column of x [N, C] (NaN = absent).

    t = (mean - tau) / (sd / sqrt(n)) with sd on ``ddof``, df = n - 1, p = P(T_df >= t).
    A column with zero spread (up to rounding) gets t = +-inf (p = 0 or 1), or NaN when its mean is tau;
    fewer than two values give NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    ok = ~np.isnan(x)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, x, 0.0).sum(0) / n
        ss = np.where(ok, (x - mean) ** 2, 0.0).sum(0)
        sd = np.sqrt(ss / (n - ddof))
    t, df, p = _t_p(n, mean, sd, tau)
    return {"n": n, "mean": np.where(n > 0, mean, np.nan), "sd": np.where(n > 0, sd, np.nan), "t": t, "df": df, "p": p}


def _t_p(n: np.ndarray, mean: np.ndarray, sd: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t, df and one-sided p from per-column n, mean and sd (the rules of :func:`one_sided_t`)."""
    from scipy import stats

    with np.errstate(invalid="ignore", divide="ignore"):
        diff = mean - tau
        t = diff / (sd / np.sqrt(n))
        flat = sd <= 1e-12 * np.maximum(1.0, np.abs(mean))  # rounding noise of a constant sample
        diff = np.where(flat & (np.abs(diff) <= 1e-12 * np.maximum(1.0, abs(tau))), 0.0, diff)
        t = np.where(~flat, t, np.where(diff > 0, np.inf, np.where(diff < 0, -np.inf, np.nan)))
    t = np.where(n >= 2, t, np.nan)
    df = np.where(n >= 2, n - 1, np.nan)
    p = np.full(t.shape, np.nan)
    good = ~np.isnan(t)
    p[good] = stats.t.sf(t[good], df[good])
    return t, df, p


def nan_patterns(x: np.ndarray):
    """Yield (rows present, columns) for each distinct pattern of present values in x [N, C]."""
    valid = ~np.isnan(x)
    if (valid == valid[:, :1]).all():  # the usual case: every head of a role has the same sentences
        yield valid[:, 0], np.arange(x.shape[1])
        return
    packed = np.packbits(valid, axis=0).T.copy()  # one byte string per column
    _, first, inverse = np.unique(
        packed.view(np.dtype((np.void, packed.shape[1]))).ravel(), return_index=True, return_inverse=True
    )
    for g, c in enumerate(first):
        yield valid[:, c], np.flatnonzero(inverse.ravel() == g)


def scipy_t_pvalues(x: np.ndarray, tau: float, ddof: int = 0) -> np.ndarray:
    """The same p-values computed independently with ``scipy.stats.ttest_1samp`` (ddof 1),
    rescaled to ``ddof``: t_ddof = t_1 * sqrt((n - ddof) / (n - 1)). Columns with the same
    present rows go to scipy together."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    p = np.full(x.shape[1], np.nan)
    for rows, cols in nan_patterns(x):
        v = x[rows][:, cols]
        n = len(v)
        if n < 2:
            continue
        live = np.ptp(v, axis=0) > 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t1 = stats.ttest_1samp(v[:, live], tau, alternative="greater", axis=0).statistic
        p[cols[live]] = stats.t.sf(t1 * np.sqrt((n - ddof) / (n - 1)), n - 1)
    return p


def pattern_rng(seed: int, pattern: np.ndarray) -> np.random.Generator:
    """A generator seeded by ``seed`` and the set of sentences (a boolean row mask): roles that
    test the same sentences share their resamples, and no role's draws depend on the others."""
    return np.random.default_rng([seed, zlib.crc32(np.packbits(pattern).tobytes()), int(pattern.sum())])


def random_signs(rng: np.random.Generator, n: int, b: int) -> np.ndarray:
    """[b, n] independent fair signs +-1."""
    bits = np.unpackbits(np.frombuffer(rng.bytes((b * n + 7) // 8), dtype=np.uint8))[: b * n]
    return bits.reshape(b, n).astype(np.float64) * 2 - 1


def sign_flip_p(
    x: np.ndarray, tau: float, b: int, rng: np.random.Generator, signs: np.ndarray | None = None
) -> np.ndarray:
    """One-sided sign-flip permutation p-value of mean(x - tau) > 0 per column (x complete;
    ``signs``: precomputed :func:`random_signs`)."""
    d = x - tau
    obs = d.mean(0)
    signs = random_signs(rng, len(d), b) if signs is None else signs
    null = signs @ d / len(d)
    tol = 1e-12 * np.maximum(1.0, np.abs(obs))
    return (1 + (null >= obs - tol).sum(0)) / (len(signs) + 1)


def wilcoxon_p(x: np.ndarray, tau: float) -> np.ndarray:
    """One-sided Wilcoxon signed-rank p-value of a median above tau, per column."""
    from scipy import stats

    d = x - tau
    out = np.full(d.shape[1], np.nan)
    live = np.any(d != 0, axis=0)
    if live.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[live] = stats.wilcoxon(d[:, live], alternative="greater", zero_method="wilcox", axis=0).pvalue
    return out


def head_table(
    scores: np.ndarray, roles: list[str], model: str, settings: HypothesisSettings, notes: dict | None = None
) -> pd.DataFrame:
    """The tidy per head x role table of one model.

    ``scores`` [N, L, H, R]: sentence scores pooled over the analysed corpora (NaN where a
    sentence has no query or pair for a role). ``notes``: role -> why it has no sentence.
    """
    notes = dict(notes or {})
    n_seq, n_layers, n_heads, n_roles = scores.shape
    if n_roles != len(roles):
        raise ValueError(f"scores have {n_roles} roles, names given for {len(roles)}")
    s = settings
    x = scores.reshape(n_seq, n_layers * n_heads, n_roles).astype(np.float64)
    res = {k: np.full((n_layers * n_heads, n_roles), np.nan) for k in ("mean", "sd", "t", "df", "p", "lo", "hi", "pnp")}
    res["n"] = np.zeros((n_layers * n_heads, n_roles), dtype=np.int64)
    draws: dict = {}
    bad_tau = not s.tau > 0
    if bad_tau:
        log.error("tau = %r: the test of mean > tau and the effect size mean / tau need tau > 0; no test is run", s.tau)
    for r, role in enumerate(roles):
        col = x[:, :, r]
        if bad_tau:
            notes[role] = f"tau = {s.tau} is not > 0: no test"
            continue
        t = one_sided_t(col, s.tau, s.ddof)
        for key in ("n", "mean", "sd", "t", "df", "p"):
            res[key][:, r] = t[key]
        if not t["n"].any():
            notes.setdefault(role, "no sentence")
            log.warning("role %s: n = 0 (%s)", role, notes[role])
            continue
        for pattern, cols in nan_patterns(col):
            if pattern.sum() < 2:
                continue
            v = col[pattern][:, cols]
            key = (np.packbits(pattern).tobytes(), int(pattern.sum()))
            if draws.get("key") != key:  # consecutive roles on the same sentences reuse the draws
                rng = pattern_rng(s.seed, pattern)
                draws = {
                    "key": key,
                    "counts": resample_counts(rng, len(v), s.bootstrap) if s.bootstrap > 0 else None,
                    "signs": random_signs(rng, len(v), s.permutations) if s.nonparametric == "sign_flip" else None,
                }
            if s.bootstrap > 0:
                res["lo"][cols, r], res["hi"][cols, r] = bootstrap_ci(
                    v, n_boot=s.bootstrap, level=s.ci, counts=draws["counts"]
                )
            if s.nonparametric == "sign_flip":
                res["pnp"][cols, r] = sign_flip_p(v, s.tau, s.permutations, None, draws["signs"])
            elif s.nonparametric == "wilcoxon":
                res["pnp"][cols, r] = wilcoxon_p(v, s.tau)
    p_adj, rej = adjust(res["p"].ravel(), s.alpha, s.fdr_method)
    pnp_adj, rej_np = adjust(res["pnp"].ravel(), s.alpha, s.fdr_method)
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    tau = s.tau if s.tau > 0 else np.nan
    frame = pd.DataFrame(
        {
            "model": model,
            "layer": np.repeat(layer, n_roles),
            "head": np.repeat(head, n_roles),
            "role": np.tile(roles, n_layers * n_heads),
            "n": res["n"].ravel(),
            "mean": res["mean"].ravel(),
            "sd": res["sd"].ravel(),
            "ci_low": res["lo"].ravel(),
            "ci_high": res["hi"].ravel(),
            "effect": res["mean"].ravel() / tau,
            "effect_ci_low": res["lo"].ravel() / tau,
            "effect_ci_high": res["hi"].ravel() / tau,
            "tau": s.tau,
            "statistic": res["t"].ravel(),
            "df": res["df"].ravel(),
            "p": res["p"].ravel(),
            "p_adj": p_adj,
            "p_nonparam": res["pnp"].ravel(),
            "p_nonparam_adj": pnp_adj,
            "significant_faithful": np.nan_to_num(res["p"].ravel(), nan=1.0) < s.alpha,
            "significant_fdr": rej,
            "significant_nonparam_fdr": rej_np,
        }
    )
    frame["note"] = frame["role"].map(notes).fillna("")
    few = (frame["n"] == 1) & (frame["note"] == "")
    frame.loc[few, "note"] = "one sentence: no test"
    flat = (frame["n"] >= 2) & ~np.isfinite(frame["statistic"]) & (frame["note"] == "")
    frame.loc[flat, "note"] = "zero variance"
    return frame[COLUMNS]


def pooled_notes(per_corpus: list[dict], roles: list[str], pooled_n: dict[str, int]) -> dict[str, str]:
    """Notes of roles that have no sentence in any corpus (joined per-corpus reasons)."""
    out = {}
    for role in roles:
        if pooled_n.get(role, 0):
            continue
        reasons = [d[role] for d in per_corpus if role in d]
        out[role] = "; ".join(reasons) if reasons else "no sentence"
    return out


# --- stability of the labels ---------------------------------------------------------------


def stratified_counts(seed: int, sizes: list[int], names: list[str], b: int) -> np.ndarray:
    """[b, sum(sizes)] bootstrap counts that resample each corpus's sentences within that corpus
    (corpus k: rows sum(sizes[:k]).. of the pooled sentences). A corpus's draws depend only on
    ``seed``, its name and its size, so adding a corpus leaves the others' draws alone."""
    parts = [
        resample_counts(np.random.default_rng([seed, zlib.crc32(name.encode()), n]), n, b)
        for n, name in zip(sizes, names)
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((b, 0))


def resampled_t(counts: np.ndarray, x: np.ndarray, tau: float, ddof: int = 0) -> dict[str, np.ndarray]:
    """:func:`one_sided_t` of every column of x [N, C] (NaN = absent) in each of the weighted
    resamples ``counts`` [B, N] at once: n, mean and sd from three matrix products."""
    x = np.asarray(x, dtype=np.float64)
    ok = ~np.isnan(x)
    n_col = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.where(n_col > 0, np.where(ok, x, 0.0).sum(0) / n_col, 0.0)  # centring keeps the sums exact-ish
    xc = np.where(ok, x - centre, 0.0)
    n = counts @ ok.astype(np.float64)  # [B, C]
    s1 = counts @ xc
    s2 = counts @ (xc * xc)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s1 / n
        ss = np.maximum(s2 - s1 * m, 0.0)
        sd = np.sqrt(ss / (n - ddof))
        mean = centre + m
    t, df, p = _t_p(n, mean, sd, tau)
    return {"n": n, "mean": np.where(n > 0, mean, np.nan), "t": t, "p": p}


def stability_shares(
    x: np.ndarray, sizes: list[int], names: list[str], settings: HypothesisSettings, chunk: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """Share of ``settings.stability_resamples`` stratified bootstrap resamples of the pooled
    sentences (x [N, C], NaN = absent; corpora of ``sizes``) in which each column is
    significant: faithful (p < alpha) and after the FDR adjustment over all C columns of that
    resample. NaN where the pooled sample itself has no test (n < 2), no resample or tau <= 0."""
    s = settings
    x = np.asarray(x, dtype=np.float64)
    nan = np.full(x.shape[1], np.nan)
    if s.stability_resamples == 0 or not s.tau > 0:
        return nan, nan.copy()
    if sum(sizes) != len(x):
        raise ValueError(f"corpus sizes {sizes} do not add up to the {len(x)} sentences")
    counts = stratified_counts(s.seed, sizes, names, s.stability_resamples)
    faithful = np.zeros(x.shape[1])
    fdr = np.zeros(x.shape[1])
    starts = progress(range(0, len(counts), chunk), "Pande stability resamples", len(counts), "resamples",
                      weight=lambda b0: min(chunk, len(counts) - b0))  # fmt: skip
    for b0 in starts:  # bounded memory; a loop over resamples, not heads
        p = resampled_t(counts[b0 : b0 + chunk], x, s.tau, s.ddof)["p"]
        faithful += (np.nan_to_num(p, nan=1.0) < s.alpha).sum(0)
        fdr += np.stack([adjust(row, s.alpha, s.fdr_method)[1] for row in p]).sum(0)
    testable = (~np.isnan(x)).sum(0) >= 2
    return np.where(testable, faithful / len(counts), np.nan), np.where(testable, fdr / len(counts), np.nan)


def corpus_shares(by_corpus: pd.DataFrame) -> pd.DataFrame:
    """Per layer, head and role: the share of the corpora with a test (a p-value) in which the
    per-corpus test gives the label, faithful and FDR, and the number of such corpora."""
    t = by_corpus.assign(tested=by_corpus["p"].notna())
    t = t.assign(f=t["significant_faithful"] & t["tested"], q=t["significant_fdr"] & t["tested"])
    g = t.groupby(["layer", "head", "role"], sort=False)[["tested", "f", "q"]].sum().reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        tested = g["tested"].to_numpy(dtype=float)
        g["corpus_share_faithful"] = np.where(tested > 0, g["f"] / np.maximum(tested, 1), np.nan)
        g["corpus_share_fdr"] = np.where(tested > 0, g["q"] / np.maximum(tested, 1), np.nan)
    g["corpora_tested"] = g["tested"].astype(np.int64)
    return g[["layer", "head", "role", "corpus_share_faithful", "corpus_share_fdr", "corpora_tested"]]


def with_stability(
    pooled: pd.DataFrame,
    x: np.ndarray,
    sizes: list[int],
    names: list[str],
    by_corpus: pd.DataFrame,
    settings: HypothesisSettings,
) -> pd.DataFrame:
    """The pooled table (rows in :func:`head_table` order, x [N, rows]) with STABILITY_COLUMNS appended."""
    if x.shape[1] != len(pooled):
        raise ValueError(f"{x.shape[1]} score columns for {len(pooled)} table rows")
    out = pooled.copy()
    out["stability_faithful"], out["stability_fdr"] = stability_shares(x, sizes, names, settings)
    shares = corpus_shares(by_corpus)
    out = out.merge(shares, on=["layer", "head", "role"], how="left", validate="one_to_one")
    out["corpora_tested"] = out["corpora_tested"].fillna(0).astype(np.int64)
    return out[list(pooled.columns) + STABILITY_COLUMNS]
