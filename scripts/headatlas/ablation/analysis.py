"""Ablations: is a head (a role, a set of heads) needed?

Effects are ``ablated - intact`` per sequence (next-token loss; for a classifier the gold
label's cross-entropy and accuracy), averaged over the evaluation sequences with a percentile
bootstrap CI over sequences (``core.bootstrap.bootstrap_ci``, one set of resamples per table).
A loss effect > 0 and an accuracy effect < 0 mean the model needs what was removed.

- single heads: attribution patching (one forward and one backward pass) estimates every
  head's effect; exact ablation checks it on the top ``exact_top`` heads of the estimate (largest
  absolute value: a large negative estimate is checked too) and
  ``exact_random`` random others (Spearman rank correlation, top-k overlap). The atlas value is
  the exact effect where one was measured, else the estimate, and says which;
- roles: every head of a role at once against ``random_sets`` seeded random sets with the same
  number of heads in every layer (drawn from the layer's heads outside the role where it has
  enough of them);
- pruning: heads removed cumulatively least specialised first (atlas order), least needed
  first (ablation order) and in a seeded random order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ..core.bootstrap import bootstrap_ci, resample_counts
from ..core.figures import head_label
from .patch import attribution_estimates, random_heads, replacement

log = logging.getLogger("headatlas.ablation.analysis")

KEY = ["layer", "head"]


@dataclass(frozen=True, kw_only=True)
class AblationSettings:
    """analysis.ablation (workflow/schemas/ablation.schema.yaml)."""

    mode: str = "mean"
    lm_sequences: int = 16
    lm_max_tokens: int = 36
    classification_examples: int = 200
    batch_size: int = 16
    exact_top: int = 10
    exact_random: int = 10
    random_sets: int = 10
    pande_roles: tuple[str, ...] = ("local", "syntactic", "delimiter", "block")
    pruning_fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0

    @classmethod
    def from_config(cls, section: dict) -> "AblationSettings":
        kw = {k: section[k] for k in cls.__dataclass_fields__ if k in section}
        for k in ("pande_roles", "pruning_fractions"):
            if k in kw:
                kw[k] = tuple(kw[k])
        return cls(**kw)


def metrics_of(task: str) -> list[str]:
    """The metrics a task reports, the main one first."""
    return ["loss"] if task == "lm" else ["accuracy", "loss"]


def _values(run: dict[str, np.ndarray], metric: str) -> np.ndarray:
    return run["correct"] if metric == "accuracy" else run["loss"]


def mean_ci(values: np.ndarray, counts: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column means of [S, C] per-sequence values and their bootstrap CI (shared resamples)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[:, None] if v.ndim == 1 else v
    lo, hi = bootstrap_ci(v, n_boot=len(counts), level=level, counts=counts)
    return v.mean(0), lo, hi


# --- single heads --------------------------------------------------------------------------

HEAD_COLUMNS = ["model", "task", "status", "reason", "layer", "head", "label", "metric", "effect", "ci_low", "ci_high",
                "method", "estimate", "estimate_ci_low", "estimate_ci_high", "exact", "exact_ci_low", "exact_ci_high",
                "intact", "n_sequences", "mode"]  # fmt: skip
CHECK_COLUMNS = ["model", "task", "status", "reason", "metric", "n_exact", "n_top", "n_random", "spearman", "spearman_p",
                 "top_k", "top_k_overlap", "mean_abs_error", "n_sequences", "mode"]  # fmt: skip


def skipped_heads(model: str, task: str, reason: str, n_layers: int, n_heads: int) -> pd.DataFrame:
    """One row per head (so that the atlas carries the reason on every head), main metric, method 'skipped'."""
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame(
        {"model": model, "task": task, "status": "skipped", "reason": reason, "layer": layer, "head": head,
         "label": [head_label(a, b) for a, b in zip(layer, head)], "metric": metrics_of(task)[0], "method": "skipped"},
        columns=HEAD_COLUMNS,
    )  # fmt: skip


def skipped_check(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=CHECK_COLUMNS)


def head_tables(model: str, evaluation, settings: AblationSettings) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Every head's ablation effect (estimated; exact on the checked heads) and the check of the
    estimate; and the replacement vectors [L, H, d] (for the role and pruning rule)."""
    L, H = evaluation.n_layers, evaluation.n_heads
    intact, means, grad_sums, zg = evaluation.gradient_pass()
    values = replacement(means, settings.mode)
    est = attribution_estimates(grad_sums, zg, values).reshape(evaluation.n_sequences, L * H)  # [S, L*H], loss
    rng = np.random.default_rng(settings.seed)
    counts = resample_counts(rng, evaluation.n_sequences, settings.bootstrap)
    order = np.argsort(-np.abs(est.mean(0)), kind="stable")  # largest |estimate|: big negative ones are checked too
    top = [(int(i // H), int(i % H)) for i in order[: settings.exact_top]]
    rand = random_heads(L, H, settings.exact_random, rng, exclude=top)
    checked = top + rand
    exact = {m: np.full((evaluation.n_sequences, L * H), np.nan) for m in metrics_of(evaluation.task)}
    for layer, head in checked:
        mask = np.zeros((L, H), bool)
        mask[layer, head] = True
        run = evaluation.run(mask, values)
        for m in exact:
            exact[m][:, layer * H + head] = _values(run, m) - _values(intact, m)
    e_mean, e_lo, e_hi = mean_ci(est, counts, settings.ci)
    idx = np.array([lay * H + h for lay, h in checked])
    rows = []
    for metric in metrics_of(evaluation.task):
        x_mean = np.full(L * H, np.nan)
        x_lo, x_hi = x_mean.copy(), x_mean.copy()
        x_mean[idx], x_lo[idx], x_hi[idx] = mean_ci(exact[metric][:, idx], counts, settings.ci)
        has_est = metric == "loss"  # attribution patching needs a differentiable metric
        is_exact = np.isfinite(x_mean)
        frame = pd.DataFrame(
            {
                "model": model,
                "task": evaluation.task,
                "status": "ok",
                "reason": "",
                "layer": np.repeat(np.arange(L), H),
                "head": np.tile(np.arange(H), L),
                "metric": metric,
                "effect": np.where(is_exact, x_mean, e_mean if has_est else np.nan),
                "ci_low": np.where(is_exact, x_lo, e_lo if has_est else np.nan),
                "ci_high": np.where(is_exact, x_hi, e_hi if has_est else np.nan),
                "method": np.where(is_exact, "exact", "estimated" if has_est else "none"),
                "estimate": e_mean if has_est else np.nan,
                "estimate_ci_low": e_lo if has_est else np.nan,
                "estimate_ci_high": e_hi if has_est else np.nan,
                "exact": x_mean,
                "exact_ci_low": x_lo,
                "exact_ci_high": x_hi,
                "intact": float(_values(intact, metric).mean()),
                "n_sequences": evaluation.n_sequences,
                "mode": settings.mode,
            }
        )
        frame.insert(6, "label", [head_label(a, b) for a, b in zip(frame["layer"], frame["head"])])
        rows.append(frame)
    heads = pd.concat(rows, ignore_index=True)[HEAD_COLUMNS]
    check = check_table(model, evaluation.task, e_mean[idx], x_mean_loss(heads)[idx], len(top), len(rand))
    check["n_sequences"] = evaluation.n_sequences
    check["mode"] = settings.mode
    return heads, check, values


def x_mean_loss(heads: pd.DataFrame) -> np.ndarray:
    return heads[heads["metric"] == "loss"]["exact"].to_numpy(float)


def check_table(
    model: str, task: str, estimate: np.ndarray, exact: np.ndarray, n_top: int, n_random: int
) -> pd.DataFrame:
    """Spearman rank correlation of estimate and exact loss effect over the checked heads, and
    how many of the exact top ``n_top`` among them (largest |effect|) are the estimate's top ``n_top``."""
    k = min(n_top, len(exact))
    rho, p = stats.spearmanr(estimate, exact) if len(exact) >= 3 and np.ptp(exact) > 0 else (np.nan, np.nan)
    top = [set(np.argsort(-np.abs(v), kind="stable")[:k]) for v in (estimate, exact)]
    both = len(top[0] & top[1])
    return pd.DataFrame(
        [{"model": model, "task": task, "status": "ok", "reason": "", "metric": "loss", "n_exact": len(exact),
          "n_top": n_top, "n_random": n_random, "spearman": rho, "spearman_p": p, "top_k": k, "top_k_overlap": both,
          "mean_abs_error": float(np.mean(np.abs(estimate - exact))) if len(exact) else np.nan}],
        columns=CHECK_COLUMNS,
    )  # fmt: skip


# --- roles ---------------------------------------------------------------------------------


def _true(col: pd.Series) -> pd.Series:
    return col.astype(str) == "True"


def role_sets(
    pande: pd.DataFrame | None,
    behaviour: pd.DataFrame | None,
    syntax: pd.DataFrame | None,
    baselines: pd.DataFrame | None,
    pande_roles: tuple[str, ...],
) -> dict[str, tuple[str, list[tuple[int, int]]]]:
    """role name -> (source, heads), from the role TSVs only:

    - ``pande_<role>``: heads significant (FDR) for a Pande role of ``pande_roles``;
    - ``clark_<label>``: heads with a Clark behaviour label other than 'other';
    - ``clark_syntax``: every head that is Clark's best head (either direction) for some relation
      (not 'All') and beats that relation's best fixed-offset baseline.
    Empty roles are left out."""
    out: dict[str, tuple[str, list[tuple[int, int]]]] = {}

    def heads_of(df):
        return sorted({(int(a), int(b)) for a, b in zip(df["layer"], df["head"])})

    if pande is not None:
        for role in pande_roles:
            sel = pande[(pande["role"] == role) & _true(pande["significant_fdr"])]
            if len(sel):
                out[f"pande_{role}"] = ("pande", heads_of(sel))
    if behaviour is not None:
        for label in sorted(set(behaviour["label"].dropna()) - {"other"}):
            out[f"clark_{label}"] = ("clark_behaviour", heads_of(behaviour[behaviour["label"] == label]))
    if syntax is not None and baselines is not None:
        rel = syntax[syntax["relation"] != "All"]
        best = rel.sort_values("accuracy", ascending=False, kind="stable").drop_duplicates("relation")
        base = baselines.groupby("relation")["accuracy"].max()
        # numeric even when the baselines table is empty (read as strings)
        threshold = pd.to_numeric(best["relation"].map(base), errors="coerce").fillna(np.inf)
        best = best[pd.to_numeric(best["accuracy"], errors="coerce") > threshold]
        if len(best):
            out["clark_syntax"] = ("clark_syntax", heads_of(best))
    return out


def matched_random_sets(
    heads: list[tuple[int, int]], n_heads: int, n_sets: int, rng: np.random.Generator
) -> list[list[tuple[int, int]]]:
    """``n_sets`` random head sets with as many heads in every layer as ``heads``: drawn from the
    layer's other heads, topped up from the role's own heads where the layer has too few others."""
    per_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        per_layer.setdefault(layer, []).append(h)
    sets = []
    for _ in range(n_sets):
        s = []
        for layer, own in sorted(per_layer.items()):
            others = np.setdiff1d(np.arange(n_heads), own)
            k = len(own)
            pick = list(rng.choice(others, size=min(k, len(others)), replace=False))
            if len(pick) < k:
                pick += list(rng.choice(own, size=k - len(pick), replace=False))
            s += [(layer, int(h)) for h in sorted(pick)]
        sets.append(s)
    return sets


def _mask(heads, L: int, H: int) -> np.ndarray:
    m = np.zeros((L, H), bool)
    for layer, h in heads:
        m[layer, h] = True
    return m


ROLE_COLUMNS = ["model", "task", "status", "reason", "metric", "role", "source", "n_heads", "layers", "effect", "ci_low",
                "ci_high", "random_mean", "random_min", "random_max", "difference", "difference_ci_low",
                "difference_ci_high", "rank_p", "needed_more_than_random", "n_random_sets", "n_sequences", "mode"]  # fmt: skip


def role_table(model: str, evaluation, values: np.ndarray, roles: dict, settings: AblationSettings) -> pd.DataFrame:
    """Each role ablated at once against its matched random sets. ``difference`` is the role's
    effect minus the mean effect of its random sets (CI over sequences); a role is needed more
    than random heads when that CI excludes 0 on the harmful side; ``rank_p`` = (1 + number of
    random sets at least as harmful) / (1 + sets)."""
    L, H = evaluation.n_layers, evaluation.n_heads
    intact = evaluation.run()
    counts = resample_counts(np.random.default_rng(settings.seed), evaluation.n_sequences, settings.bootstrap)
    rows = []
    for i, (role, (source, heads)) in enumerate(roles.items()):
        if len(heads) >= L * H:
            log.info("role %s holds every head: nothing to compare with", role)
            continue
        rng = np.random.default_rng([settings.seed, i])
        randoms = matched_random_sets(heads, H, settings.random_sets, rng)
        runs = [evaluation.run(_mask(s, L, H), values) for s in [heads] + randoms]
        layers = np.bincount([lay for lay, _ in heads], minlength=L)
        for metric in metrics_of(evaluation.task):
            d = np.stack([_values(r, metric) - _values(intact, metric) for r in runs], 1)  # [S, 1 + R]
            sign = -1.0 if metric == "accuracy" else 1.0  # harm > 0
            diff = d[:, 0] - d[:, 1:].mean(1)
            mean, lo, hi = mean_ci(np.column_stack([d[:, 0], diff]), counts, settings.ci)
            rand = d[:, 1:].mean(0)
            harm_lo = min(sign * lo[1], sign * hi[1])
            rows.append({
                "model": model, "task": evaluation.task, "status": "ok", "reason": "", "metric": metric, "role": role,
                "source": source, "n_heads": len(heads), "layers": ",".join(str(int(c)) for c in layers),
                "effect": mean[0], "ci_low": lo[0], "ci_high": hi[0], "random_mean": rand.mean(),
                "random_min": rand.min(), "random_max": rand.max(), "difference": mean[1], "difference_ci_low": lo[1],
                "difference_ci_high": hi[1], "rank_p": (1 + int((sign * rand >= sign * mean[0]).sum())) / (1 + len(rand)),
                "needed_more_than_random": bool(harm_lo > 0), "n_random_sets": len(randoms),
                "n_sequences": evaluation.n_sequences, "mode": settings.mode,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=ROLE_COLUMNS)


def skipped_roles(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=ROLE_COLUMNS)


# --- pruning -------------------------------------------------------------------------------


def specialisation(L: int, H: int, roles: dict, pande: pd.DataFrame | None) -> pd.DataFrame:
    """Per head: ``n_roles`` (how many of the role sets hold it) and ``max_pande_effect`` (its
    largest Pande effect, mean score / tau, over every role tested). Least specialised = fewest
    roles, then smallest Pande effect."""
    n = np.zeros((L, H), int)
    for _, heads in roles.values():
        for layer, h in heads:
            n[layer, h] += 1
    eff = np.zeros((L, H))
    if pande is not None and len(pande):
        e = pande.groupby(KEY)["effect"].max()
        for (layer, h), v in e.items():
            if np.isfinite(v):
                eff[int(layer), int(h)] = v
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"layer": layer, "head": head, "n_roles": n.ravel(), "max_pande_effect": eff.ravel()})


def pruning_orders(spec: pd.DataFrame, effect: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Flat head indices (layer * H + head) in removal order: 'atlas' (least specialised first),
    'ablation' (smallest effect first: least needed) and 'random' (seeded); ties keep index order."""
    n = len(spec)
    atlas = np.lexsort((np.arange(n), spec["max_pande_effect"].to_numpy(), spec["n_roles"].to_numpy()))
    abl = np.lexsort((np.arange(n), np.nan_to_num(np.asarray(effect, float), nan=np.inf)))
    return {"atlas": atlas, "ablation": abl, "random": np.random.default_rng([seed, 7]).permutation(n)}


PRUNING_COLUMNS = ["model", "task", "status", "reason", "metric", "order", "n_removed", "fraction", "value", "ci_low",
                   "ci_high", "n_sequences", "mode"]  # fmt: skip


def pruning_table(
    model: str, evaluation, values: np.ndarray, orders: dict[str, np.ndarray], settings: AblationSettings
) -> pd.DataFrame:
    """The metric (not its change) with the first k heads of every order removed, k from the
    fractions of all heads (k = 0: the intact model)."""
    L, H = evaluation.n_layers, evaluation.n_heads
    N = L * H
    ks = sorted({0} | {int(round(f * N)) for f in settings.pruning_fractions})
    counts = resample_counts(np.random.default_rng(settings.seed), evaluation.n_sequences, settings.bootstrap)
    intact = evaluation.run()
    rows = []
    for name, order in orders.items():
        for k in ks:
            if k == 0:
                run = intact
            else:
                mask = np.zeros(N, bool)
                mask[order[:k]] = True
                run = evaluation.run(mask.reshape(L, H), values)
            for metric in metrics_of(evaluation.task):
                m, lo, hi = mean_ci(_values(run, metric), counts, settings.ci)
                rows.append({"model": model, "task": evaluation.task, "status": "ok", "reason": "", "metric": metric,
                             "order": name, "n_removed": k, "fraction": k / N, "value": m[0], "ci_low": lo[0],
                             "ci_high": hi[0], "n_sequences": evaluation.n_sequences, "mode": settings.mode})  # fmt: skip
    return pd.DataFrame(rows, columns=PRUNING_COLUMNS)


def skipped_pruning(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame(
        [{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=PRUNING_COLUMNS
    )


# --- the rules -----------------------------------------------------------------------------

INT_COLUMNS = ("layer", "head", "n_sequences", "n_exact", "n_top", "n_random", "top_k", "top_k_overlap", "n_heads",
               "n_random_sets", "n_removed")  # fmt: skip


def _tidy(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One table; counts stay integers and flags booleans beside a skipped task's empty cells."""
    df = pd.concat(frames, ignore_index=True)
    for c in df.columns:
        if c in INT_COLUMNS:
            df[c] = df[c].astype("Int64")
        elif c == "needed_more_than_random":
            df[c] = df[c].astype("boolean")
    return df


def ablate_heads(
    model: str, evals: dict, settings: AblationSettings, shape: tuple[int, int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rule ablation_heads: heads.tsv and check.tsv over both tasks (a skipped task keeps its
    reason: on every head in heads.tsv, once in check.tsv). ``shape``: (layers, heads)."""
    heads, checks = [], []
    for task, (ev, reason) in evals.items():
        if ev is None:
            heads.append(skipped_heads(model, task, reason, *shape))
            checks.append(skipped_check(model, task, reason))
            continue
        h, c, _ = head_tables(model, ev, settings)
        heads.append(h)
        checks.append(c)
        log.info("model %s, %s: estimate vs exact on %d heads: spearman %.3f, top-%d overlap %d",
                 model, task, c["n_exact"].iloc[0], c["spearman"].iloc[0], c["top_k"].iloc[0], c["top_k_overlap"].iloc[0])  # fmt: skip
    return _tidy(heads), _tidy(checks)


def ablate_roles(
    model: str, evals: dict, heads: pd.DataFrame, tables: dict[str, pd.DataFrame | None], settings: AblationSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rule ablation_roles: roles.tsv and pruning.tsv over both tasks. ``tables``: the role TSVs
    (pande, behaviour, syntax, syntax_baselines; None when that analysis does not cover the model)."""
    roles_out, pruning_out = [], []
    for task, (ev, reason) in evals.items():
        if ev is None:
            roles_out.append(skipped_roles(model, task, reason))
            pruning_out.append(skipped_pruning(model, task, reason))
            continue
        L, H = ev.n_layers, ev.n_heads
        values = replacement(ev.mean_vectors(), settings.mode)
        roles = role_sets(tables.get("pande"), tables.get("behaviour"), tables.get("syntax"),
                          tables.get("syntax_baselines"), settings.pande_roles)  # fmt: skip
        for name, (_, hs) in roles.items():
            if any(lay >= L or h >= H for lay, h in hs):
                raise ValueError(f"role {name}: heads outside the {L} x {H} grid of model {model!r}")
        log.info("model %s, %s: roles %s", model, task, {k: len(v[1]) for k, v in roles.items()})
        roles_out.append(role_table(model, ev, values, roles, settings))
        eff = heads[(heads["task"] == task) & (heads["metric"] == "loss")].sort_values(KEY)["effect"].to_numpy(float)
        if len(eff) != L * H:
            raise ValueError(
                f"heads table of model {model!r}: {len(eff)} loss effects for task {task}, expected {L * H}"
            )
        orders = pruning_orders(specialisation(L, H, roles, tables.get("pande")), eff, settings.seed)
        pruning_out.append(pruning_table(model, ev, values, orders, settings))
    return _tidy(roles_out), _tidy(pruning_out)
