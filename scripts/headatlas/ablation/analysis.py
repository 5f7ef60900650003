"""Ablations: is a head (a role, a set of heads) needed?

Effects are ``ablated - intact`` per sequence (next-token loss in nats; for a classifier the gold
label's cross-entropy in nats and accuracy, a share: x 100 = accuracy points), averaged over the
evaluation sequences with a percentile bootstrap CI over sequences (``core.bootstrap.bootstrap_ci``,
one set of resamples per table). A loss effect > 0 and an accuracy effect < 0 mean the model needs
what was removed.

- single heads: exact ablation of every head, batched (``Evaluation.exact``), wherever the model
  has at most ``exact_max_heads`` heads or runs on a GPU. Elsewhere an estimate (attribution
  patching or integrated gradients) for every head, checked in every layer by exact ablation of
  ``check_heads`` seeded heads: a layer fails when a checked head's estimate has the opposite sign
  of an exact effect whose CI excludes 0, or misses the exact effect by more than the CI's
  half-width. A failing layer gets exact values for all its heads (``on_check_fail: exact``) or its
  estimates are marked ``unreliable`` and never given as effects. Every value says what it is
  (``kind``: ``exact``, ``estimated (checked)``, ``unreliable``, ``skipped: <reason>``). With exact
  values everywhere the check still compares the estimators of ``compare_estimators`` with them;
- roles: every head of a role at once against ``random_sets`` seeded random sets with the same
  number of heads in every layer (drawn from the layer's heads outside the role where it has
  enough of them);
- pruning: heads removed cumulatively least specialised first (atlas order), least needed
  first (ablation order) and in a seeded random order; and the share of heads removable in the
  ablation order while the main metric stays within a tolerance of intact, with its CI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.bootstrap import bootstrap_ci, resample_counts
from ..core.device import input_device
from ..core.figures import head_label
from ..core.io import atomic_path, flags
from ..core.settings import Settings
from .patch import layer_samples

log = logging.getLogger("headatlas.ablation.analysis")

KEY = ["layer", "head"]
KINDS = ("exact", "estimated (checked)", "unreliable")  # and "skipped: <reason>"
UNITS = {"loss": "nats", "accuracy": "accuracy points / 100 (a share)"}
ACCURACY_NOTE = "skipped: accuracy has no gradient estimate (exact ablation only)"


@dataclass(frozen=True, kw_only=True)
class AblationSettings(Settings):
    """analysis.ablation (workflow/schemas/ablation.schema.yaml)."""

    SECTION = "analysis.ablation"

    mode: str = "mean"
    lm_sequences: int = 16
    lm_max_tokens: int = 36
    classification_examples: int = 200
    batch_size: int = 16
    exact_max_heads: int = 200
    exact_max_rows: int = 4096
    estimator: str = "atp"
    ig_steps: int = 4
    compare_estimators: tuple[str, ...] = ("atp",)
    check_heads: int = 4
    check_seed: int = 0
    on_check_fail: str = "exact"
    random_sets: int = 10
    pande_roles: tuple[str, ...] = ("local", "syntactic", "delimiter", "block")
    pruning_fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)
    prune_loss_nats: float = 0.1
    prune_accuracy_points: float = 1.0
    prune_grid: int = 24
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0


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

HEAD_COLUMNS = ["model", "task", "status", "reason", "layer", "head", "label", "metric", "unit", "effect", "ci_low",
                "ci_high", "kind", "method", "estimate", "estimate_ci_low", "estimate_ci_high", "exact", "exact_ci_low",
                "exact_ci_high", "intact", "n_sequences", "mode"]  # fmt: skip
CHECK_COLUMNS = ["model", "task", "status", "reason", "metric", "estimator", "scope", "layer", "n_compared", "spearman",
                 "top_k", "top_k_overlap", "max_abs_error", "mean_abs_error", "n_sign_flips", "n_outside_ci", "passed",
                 "action", "n_sequences", "mode"]  # fmt: skip


def skipped_heads(model: str, task: str, reason: str, n_layers: int, n_heads: int) -> pd.DataFrame:
    """One row per head (so that the atlas carries the reason on every head), main metric, method 'skipped'."""
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    metric = metrics_of(task)[0]
    return pd.DataFrame(
        {"model": model, "task": task, "status": "skipped", "reason": reason, "layer": layer, "head": head,
         "label": [head_label(a, b) for a, b in zip(layer, head)], "metric": metric, "unit": UNITS[metric],
         "kind": f"skipped: {reason}", "method": "skipped"},
        columns=HEAD_COLUMNS,
    )  # fmt: skip


def skipped_check(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=CHECK_COLUMNS)


def exact_everywhere(evaluation, settings: AblationSettings) -> bool:
    """Exact ablation of every head: on a GPU, or with at most ``exact_max_heads`` heads."""
    device = input_device(evaluation.model).type
    return device != "cpu" or evaluation.n_layers * evaluation.n_heads <= settings.exact_max_heads


def layer_check(
    estimate: np.ndarray, exact: np.ndarray, lo: np.ndarray, hi: np.ndarray, samples: list[list[int]], n_heads: int
) -> pd.DataFrame:
    """Per layer, the estimate [L * H] against the exact effect and its CI on the sampled heads:
    a sign flip (opposite signs, the exact CI excluding 0) or an error above the CI's half-width
    fails the layer."""
    rows = []
    for layer, heads in enumerate(samples):
        i = np.array([layer * n_heads + h for h in heads], dtype=np.int64)
        e, x = estimate[i], exact[i]
        flips = (np.sign(e) != np.sign(x)) & ((lo[i] > 0) | (hi[i] < 0))
        outside = np.abs(e - x) > (hi[i] - lo[i]) / 2
        rows.append({"layer": layer, "n_compared": len(i), "max_abs_error": float(np.max(np.abs(e - x))),
                     "mean_abs_error": float(np.mean(np.abs(e - x))), "n_sign_flips": int(flips.sum()),
                     "n_outside_ci": int(outside.sum()), "passed": bool(not (flips | outside).any())})  # fmt: skip
    return pd.DataFrame(rows)


def agreement(estimate: np.ndarray, exact: np.ndarray, k: int = 10) -> dict:
    """Spearman rho, top-k overlap (largest |value|), largest and mean absolute error."""
    from scipy import stats  # here: the workflow imports this module when it plans (its settings)

    k = min(k, len(exact))
    ok = len(exact) >= 3 and np.ptp(exact) > 0 and np.ptp(estimate) > 0
    rho = stats.spearmanr(estimate, exact)[0] if ok else np.nan
    top = [set(np.argsort(-np.abs(v), kind="stable")[:k]) for v in (estimate, exact)]
    err = np.abs(estimate - exact)
    return {"n_compared": len(exact), "spearman": rho, "top_k": k, "top_k_overlap": len(top[0] & top[1]),
            "max_abs_error": float(err.max()) if len(err) else np.nan,
            "mean_abs_error": float(err.mean()) if len(err) else np.nan}  # fmt: skip


def job_heads(n_layers: int, n_heads: int, jobs: int, part: int) -> list[int]:
    """The flat heads of exact job ``part`` of ``jobs``: every head of the layers l with
    l % jobs == part (interleaved, so that every job gets early heads, which cost the most, and late ones)."""
    return [lay * n_heads + h for lay in range(part, n_layers, jobs) for h in range(n_heads)]


def exact_heads(evaluation, settings: AblationSettings) -> list[int]:
    """The flat heads ablated exactly before any check: every head (:func:`exact_everywhere`), else the
    ``check_heads`` seeded heads of every layer (the layer check)."""
    ev, s = evaluation, settings
    if exact_everywhere(ev, s):
        return list(range(ev.n_layers * ev.n_heads))
    samples = layer_samples(ev.n_layers, ev.n_heads, s.check_heads, s.check_seed)
    return sorted(lay * ev.n_heads + h for lay, hs in enumerate(samples) for h in hs)


def _key(metric: str) -> str:
    """The key of a metric in :meth:`Evaluation.run`'s (and :meth:`Evaluation.exact`'s) per-sequence results."""
    return "correct" if metric == "accuracy" else "loss"


def _checked(ev, s: AblationSettings, parts: list[dict] | None, layers=None) -> dict:
    """The exact ablations of a head table and the layer check: every head where the model gets exact ablation
    everywhere, else the check's heads, the estimate, the check and (``on_check_fail: exact``) every head of a
    failing layer. ``parts``: ablations already run (:func:`exact_part`), used where they cover a head (and their
    estimate); ``layers``: ablate only heads of these layers (an exact job's share; None: every layer)."""
    L, H, S = ev.n_layers, ev.n_heads, ev.n_sequences
    N = L * H
    values = ev.replacement(s.mode, s.seed)
    intact = ev.run()
    metrics = metrics_of(ev.task)
    counts = resample_counts(np.random.default_rng(s.seed), S, s.bootstrap)
    ablated = {m: np.full((S, N), np.nan) for m in metrics}  # per-sequence metric with the head ablated
    for p in parts or ():
        for m in metrics:
            ablated[m][:, p["heads"]] = p[_key(m)]
    allowed = np.ones(N, bool) if layers is None else np.isin(np.repeat(np.arange(L), H), list(layers))

    def measure(flat):
        flat = [f for f in flat if allowed[f] and np.isnan(ablated[metrics[0]][0, f])]
        if flat:
            run = ev.exact(flat, values, s.exact_max_rows)
            for m in metrics:
                ablated[m][:, flat] = _values(run, m)

    def summary(m):
        x, lo, hi = (np.full(N, np.nan) for _ in range(3))
        done = np.flatnonzero(np.isfinite(ablated[m][0]))
        if len(done):
            x[done], lo[done], hi[done] = mean_ci(ablated[m][:, done] - _values(intact, m)[:, None], counts, s.ci)
        return x, lo, hi

    everywhere = exact_everywhere(ev, s)
    samples = layer_samples(L, H, s.check_heads, s.check_seed)
    # exact everywhere: the estimators are only compared, once, in the gather (an exact job skips them)
    compared = list(dict.fromkeys(s.compare_estimators)) if layers is None else []
    names = compared if everywhere else [s.estimator]
    given = [p["estimate"] for p in parts or () if "estimate" in p]
    # [S, N] loss effects; a gather of checked estimates takes the exact jobs' estimate
    est = {
        e: given[0] if given and not everywhere else ev.estimate(values, e, s.ig_steps, s.exact_max_rows) for e in names
    }
    measure(exact_heads(ev, s))
    checks, failed = [], set()
    for e in names:
        x, lo, hi = summary("loss")
        lc = layer_check(mean_ci(est[e], counts, s.ci)[0], x, lo, hi, samples, H)
        if layers is not None:
            lc = lc[lc["layer"].isin(list(layers))]
        bad = set(lc.loc[~lc["passed"], "layer"].astype(int))
        if not everywhere:
            failed = bad
        lc["action"] = ["none" if p else ("none (exact everywhere)" if everywhere else s.on_check_fail)
                        for p in lc["passed"]]  # fmt: skip
        lc["scope"], lc["estimator"] = "layer", e
        checks.append(lc)
    if failed and s.on_check_fail == "exact":
        log.info("%s: layers %s fail the check: exact ablation of all their heads", ev.task, sorted(failed))
        measure([lay * H + h for lay in sorted(failed) for h in range(H)])
    return dict(intact=intact, metrics=metrics, counts=counts, ablated=ablated, summary=summary, est=est,
                names=names, everywhere=everywhere, checks=checks, failed=failed)  # fmt: skip


def exact_part(evaluation, settings: AblationSettings, jobs: int, part: int) -> dict[str, np.ndarray]:
    """Rule ablation_exact: the per-sequence metrics [S, heads] of exact job ``part`` of ``jobs`` (``heads``: its
    flat heads, every head of the layers of :func:`job_heads`): every head where the model gets exact ablation
    everywhere, else its layers' checked heads and every head of its layers that fail the check; with the estimate
    [S, L * H] (``estimate``) on that path."""
    ev, s = evaluation, settings
    c = _checked(ev, s, None, layers=range(part, ev.n_layers, jobs))
    done = np.flatnonzero(np.isfinite(c["ablated"][c["metrics"][0]][0]))
    out = {_key(m): c["ablated"][m][:, done] for m in c["metrics"]}
    if not c["everywhere"]:
        out["estimate"] = c["est"][s.estimator]
    return dict(out, heads=done.astype(np.int64))


def head_tables(
    model: str, evaluation, settings: AblationSettings, parts: list[dict] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every head's ablation effect (exact, or a checked estimate) per metric and the check table.
    ``parts``: exact ablations already run (:func:`exact_part`, the split jobs), used where they cover a head."""
    ev, s = evaluation, settings
    L, H, S = ev.n_layers, ev.n_heads, ev.n_sequences
    N = L * H
    c = _checked(ev, s, parts)
    intact, metrics, counts, summary, est = c["intact"], c["metrics"], c["counts"], c["summary"], c["est"]
    names, everywhere, checks, failed = c["names"], c["everywhere"], c["checks"], c["failed"]
    x_loss = summary("loss")[0]
    done = np.flatnonzero(np.isfinite(x_loss))
    for e in names:
        row = agreement(mean_ci(est[e], counts, s.ci)[0][done], x_loss[done])
        checks.insert(0, pd.DataFrame([dict(row, scope="exact heads", estimator=e, action="")]))
    check = pd.concat(checks, ignore_index=True)
    check = check.assign(model=model, task=ev.task, status="ok", reason="", metric="loss", n_sequences=S, mode=s.mode)
    check = check.reindex(columns=CHECK_COLUMNS)

    layer_of = np.repeat(np.arange(L), H)
    unreliable = np.isin(layer_of, sorted(failed)) if s.on_check_fail == "unreliable" else np.zeros(N, bool)
    main = (names[0] if names else None) if everywhere else s.estimator
    e_mean, e_lo, e_hi = mean_ci(est[main], counts, s.ci) if main else (np.full(N, np.nan),) * 3
    rows = []
    for metric in metrics:
        x_mean, x_lo, x_hi = summary(metric)
        is_exact = np.isfinite(x_mean)
        has_est = metric == "loss"  # the estimates need a differentiable metric
        if has_est:
            kind = np.where(is_exact, "exact", np.where(unreliable, "unreliable", "estimated (checked)"))
        else:
            kind = np.where(is_exact, "exact", ACCURACY_NOTE)
        shown = kind == "estimated (checked)"
        nan = np.full(N, np.nan)
        frame = pd.DataFrame(
            {
                "model": model,
                "task": ev.task,
                "status": "ok",
                "reason": "",
                "layer": layer_of,
                "head": np.tile(np.arange(H), L),
                "label": [head_label(a, b) for a, b in zip(layer_of, np.tile(np.arange(H), L))],
                "metric": metric,
                "unit": UNITS[metric],
                "effect": np.where(is_exact, x_mean, np.where(shown, e_mean if has_est else nan, nan)),
                "ci_low": np.where(is_exact, x_lo, np.where(shown, e_lo if has_est else nan, nan)),
                "ci_high": np.where(is_exact, x_hi, np.where(shown, e_hi if has_est else nan, nan)),
                "kind": kind,
                "method": np.where(is_exact, "exact", main if has_est else "none"),
                "estimate": e_mean if has_est else nan,
                "estimate_ci_low": e_lo if has_est else nan,
                "estimate_ci_high": e_hi if has_est else nan,
                "exact": x_mean,
                "exact_ci_low": x_lo,
                "exact_ci_high": x_hi,
                "intact": float(_values(intact, metric).mean()),
                "n_sequences": S,
                "mode": s.mode,
            }
        )
        rows.append(frame)
    return pd.concat(rows, ignore_index=True)[HEAD_COLUMNS], check


# --- roles ---------------------------------------------------------------------------------


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
            sel = pande[(pande["role"] == role) & flags(pande["significant_fdr"])]
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
    heads: list[tuple[int, int]], n_heads: int, n_sets: int, rng: np.random.Generator, exclude=()
) -> list[list[tuple[int, int]]]:
    """``n_sets`` random head sets with as many heads in every layer as ``heads``: drawn from the
    layer's other heads (outside ``exclude``, (layer, head) pairs), topped up from the role's own heads
    where the layer has too few others."""
    per_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        per_layer.setdefault(layer, []).append(h)
    sets = []
    for _ in range(n_sets):
        s = []
        for layer, own in sorted(per_layer.items()):
            others = np.setdiff1d(np.arange(n_heads), own + [h for lay, h in exclude if lay == layer])
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


REMOVABLE_COLUMNS = ["model", "task", "status", "reason", "metric", "order", "tolerance", "unit", "intact", "n_heads",
                     "n_removable", "share", "share_ci_low", "share_ci_high", "value", "first_failing", "n_evaluated",
                     "n_sequences", "mode"]  # fmt: skip


def first_failure(harm: np.ndarray, tolerance: float) -> np.ndarray:
    """Per row of ``harm`` [B, K] (harm at increasing numbers of heads removed; column 0 = none),
    the index of the last column before the first one whose harm exceeds ``tolerance``."""
    bad = harm > tolerance
    first = np.where(bad.any(1), bad.argmax(1), harm.shape[1])
    return first - 1


def removable_table(model: str, evaluation, values, order: np.ndarray, settings: AblationSettings) -> pd.DataFrame:
    """How many heads can go, in ``order`` (the ablation order), while the main metric stays
    within the tolerance of intact (accuracy: ``prune_accuracy_points`` points; loss:
    ``prune_loss_nats``): the metric on a grid of ``prune_grid`` + 1 head counts, then bisection
    between the last count within it and the first one past it (so the count is exact if the
    metric's harm is monotone there). The CI resamples the sequences over the evaluated counts."""
    ev, s = evaluation, settings
    L, H = ev.n_layers, ev.n_heads
    N = L * H
    metric = metrics_of(ev.task)[0]
    sign, tol = (-1.0, s.prune_accuracy_points / 100) if metric == "accuracy" else (1.0, s.prune_loss_nats)
    runs: dict[int, np.ndarray] = {}

    def at(k: int) -> np.ndarray:
        if k not in runs:
            mask = np.zeros(N, bool)
            mask[order[:k]] = True
            runs[k] = _values(ev.run(mask.reshape(L, H), values) if k else ev.run(), metric)
        return runs[k]

    def harm(k: int) -> float:
        return sign * float(at(k).mean() - at(0).mean())

    grid = sorted({int(round(x)) for x in np.linspace(0, N, s.prune_grid + 1)})
    ok = 0
    for k in grid[1:]:
        if harm(k) > tol:
            hi = k
            while hi - ok > 1:
                mid = (ok + hi) // 2
                ok, hi = (mid, hi) if harm(mid) <= tol else (ok, mid)
            break
        ok = k
    ks = sorted(runs)
    vals = np.stack([runs[k] for k in ks], 1)  # [S, K]
    counts = resample_counts(np.random.default_rng([s.seed, 5]), ev.n_sequences, s.bootstrap)
    means = counts @ vals / counts.sum(1, keepdims=True)  # [B, K]
    boot = np.asarray(ks)[first_failure(sign * (means - means[:, :1]), tol)]
    q = (1 - s.ci) / 2
    lo, hi_ = np.quantile(boot / N, [q, 1 - q])
    fail = [k for k in ks if harm(k) > tol]
    return pd.DataFrame(
        [{"model": model, "task": ev.task, "status": "ok", "reason": "", "metric": metric, "order": "ablation",
          "tolerance": tol * (100 if metric == "accuracy" else 1),
          "unit": "accuracy points" if metric == "accuracy" else "nats", "intact": float(at(0).mean()), "n_heads": N,
          "n_removable": ok, "share": ok / N, "share_ci_low": lo, "share_ci_high": hi_, "value": float(at(ok).mean()),
          "first_failing": fail[0] if fail else pd.NA, "n_evaluated": len(ks), "n_sequences": ev.n_sequences,
          "mode": s.mode}],
        columns=REMOVABLE_COLUMNS,
    )  # fmt: skip


def skipped_removable(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame(
        [{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=REMOVABLE_COLUMNS
    )


def skipped_pruning(model: str, task: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame(
        [{"model": model, "task": task, "status": "skipped", "reason": reason}], columns=PRUNING_COLUMNS
    )


# --- the rules -----------------------------------------------------------------------------

INT_COLUMNS = ("layer", "head", "n_sequences", "n_compared", "n_sign_flips", "n_outside_ci", "top_k", "top_k_overlap",
               "n_heads", "n_random_sets", "n_removed", "n_removable")  # fmt: skip


def _tidy(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One table; counts stay integers and flags booleans beside a skipped task's empty cells."""
    df = pd.concat(frames, ignore_index=True)
    for c in df.columns:
        if c in INT_COLUMNS:
            df[c] = df[c].astype("Int64")
        elif c in ("needed_more_than_random", "passed"):
            df[c] = df[c].astype("boolean")
    return df


def ablate_heads(
    model: str, evals: dict, settings: AblationSettings, shape: tuple[int, int], parts: dict | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rule ablation_heads: heads.tsv and check.tsv over both tasks (a skipped task keeps its
    reason: on every head in heads.tsv, once in check.tsv). ``shape``: (layers, heads); ``parts``:
    task -> the exact jobs' results (:func:`exact_part`)."""
    heads, checks = [], []
    for task, (ev, reason) in evals.items():
        if ev is None:
            heads.append(skipped_heads(model, task, reason, *shape))
            checks.append(skipped_check(model, task, reason))
            continue
        h, c = head_tables(model, ev, settings, (parts or {}).get(task))
        heads.append(h)
        checks.append(c)
        for r in c[c["scope"] == "exact heads"].itertuples():
            log.info("model %s, %s: %s vs exact on %d heads: spearman %.3f, top-%d overlap %d, largest error %.4g",
                     model, task, r.estimator, r.n_compared, r.spearman, r.top_k, r.top_k_overlap, r.max_abs_error)  # fmt: skip
        log.info("model %s, %s: kinds %s", model, task, h.groupby("metric")["kind"].value_counts().to_dict())
    return _tidy(heads), _tidy(checks)


def ablate_roles(
    model: str, evals: dict, heads: pd.DataFrame, tables: dict[str, pd.DataFrame | None], settings: AblationSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rule ablation_roles: roles.tsv, pruning.tsv and removable.tsv over both tasks. ``tables``: the
    role TSVs (pande, behaviour, syntax, syntax_baselines; None when that analysis does not cover the model)."""
    roles_out, pruning_out, removable_out = [], [], []
    for task, (ev, reason) in evals.items():
        if ev is None:
            roles_out.append(skipped_roles(model, task, reason))
            pruning_out.append(skipped_pruning(model, task, reason))
            removable_out.append(skipped_removable(model, task, reason))
            continue
        L, H = ev.n_layers, ev.n_heads
        values = ev.replacement(settings.mode, settings.seed)
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
        removable_out.append(removable_table(model, ev, values, orders["ablation"], settings))
        r = removable_out[-1].iloc[0]
        log.info("model %s, %s: %d of %d heads removable (ablation order) within %g %s (share %.3f, CI %.3f-%.3f)",
                 model, task, r["n_removable"], r["n_heads"], r["tolerance"], r["unit"], r["share"], r["share_ci_low"],
                 r["share_ci_high"])  # fmt: skip
    return _tidy(roles_out), _tidy(pruning_out), _tidy(removable_out)


def write_exact_part(path, parts: dict[str, dict | None]) -> None:
    """One exact job's results (task -> :func:`exact_part`, None: a task the model does not have) as an .npz file."""
    arrays = {f"{task}/{k}": v for task, p in parts.items() if p is not None for k, v in p.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def read_exact_parts(paths) -> dict[str, list[dict]]:
    """task -> the exact jobs' results, from the files of :func:`write_exact_part`."""
    out: dict[str, list[dict]] = {}
    for path in paths:
        part: dict[str, dict] = {}
        with np.load(path) as z:
            for key in z.files:
                task, k = key.split("/", 1)
                part.setdefault(task, {})[k] = z[key]
        for task, p in part.items():
            out.setdefault(task, []).append(p)
    return out
