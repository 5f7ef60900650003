"""Function-vector heads (Todd et al., ICLR 2024, and their released ``function_vectors`` code).

Per task (:mod:`headatlas.icl.tasks`): ``n_prompts`` clean ``shots``-shot prompts, on which the model's accuracy
(top-1 token = the target's first token) is measured and each head's mean output at the last position taken
(``get_mean_head_activations``); and ``n_prompts`` other prompts with the demonstrations' labels permuted (the
corrupted prompts). On a corrupted prompt one head's output at the last position is replaced by its task's mean;
the indirect effect is p(target | patched) - p(target | corrupted) (``compute_indirect_effect`` with
``last_token_only``). A head's AIE is the mean over the corrupted prompts of every task used (equal numbers per
task, so also the mean of the tasks' means), with a percentile bootstrap CI over prompts.

A task is used when it has at least ``min_pairs`` single-token pairs and the model's clean accuracy reaches
``min_accuracy``; the others are shown in the task table with the reason.

Every head is patched exactly (batched, :meth:`headatlas.ablation.tasks.Evaluation.exact`) where the model has at
most ``exact_max_heads`` heads or runs on a GPU; elsewhere attribution patching estimates every head and is checked
in every layer against exact values of ``check_heads`` seeded heads, with the ablation's rule and kinds
(:func:`headatlas.ablation.analysis.head_tables`: exact, estimated (checked), unreliable).

Null: every head patched with another head's mean (a seeded derangement of the heads,
:func:`headatlas.ablation.patch.donors`), measured the same way; a head's ``null_quantile`` is the share of the null
AIEs below its AIE (ties count half), and ``above_null`` says that its CI's lower end exceeds the null's
``ci`` quantile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..ablation.analysis import AblationSettings, head_tables, mean_ci
from ..ablation.patch import donors
from ..core.agreement import spearman_ci, topk_overlap
from ..core.bootstrap import resample_counts
from ..core.figures import head_label
from ..core.models import decoder_bos, lm_head_model, model_kind, resolve
from ..core.settings import Settings
from .patching import TaskMeans, fv_evaluation
from .tasks import TASKS, build_prompts, single_token_pairs

log = logging.getLogger("headatlas.icl.analysis")


@dataclass(frozen=True, kw_only=True)
class IclSettings(Settings):
    """analysis.icl (workflow/schemas/icl.schema.yaml)."""

    SECTION = "analysis.icl"

    tasks: tuple[str, ...] = TASKS
    n_prompts: int = 25
    shots: int = 10
    min_pairs: int = 100
    min_accuracy: float = 0.5
    batch_size: int = 16
    exact_max_heads: int = 200
    exact_max_rows: int = 16384
    check_heads: int = 4
    check_seed: int = 0
    on_check_fail: str = "exact"
    top_k: int = 10
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0

    def ablation(self) -> AblationSettings:
        """The ablation settings that run the patching and its check (mean replacement, attribution patching)."""
        return AblationSettings(
            mode="mean", batch_size=self.batch_size, exact_max_heads=self.exact_max_heads,
            exact_max_rows=self.exact_max_rows, estimator="atp", compare_estimators=("atp",),
            check_heads=self.check_heads, check_seed=self.check_seed, on_check_fail=self.on_check_fail,
            bootstrap=self.bootstrap, ci=self.ci, seed=self.seed,
        )  # fmt: skip


TASK_COLUMNS = ["model", "task", "n_pairs", "n_single_token", "n_prompts", "shots", "accuracy", "accuracy_ci_low",
                "accuracy_ci_high", "p_target", "corrupted_accuracy", "p_target_corrupted", "used", "reason"]  # fmt: skip
HEAD_COLUMNS = ["model", "layer", "head", "label", "aie", "ci_low", "ci_high", "kind", "method", "estimate", "exact",
                "exact_ci_low", "exact_ci_high", "null_aie", "null_quantile", "above_null", "rank", "top",
                "p_corrupted", "n_prompts", "tasks"]  # fmt: skip
CHECK_COLUMNS = ["model", "replacement", "estimator", "scope", "layer", "n_compared", "spearman", "top_k",
                 "top_k_overlap", "max_abs_error", "mean_abs_error", "n_sign_flips", "n_outside_ci", "passed", "action",
                 "n_prompts"]  # fmt: skip


@dataclass
class TaskRun:
    """One task's prompts and what the model does with them."""

    task: str
    n_pairs: int
    n_single_token: int
    clean: object = None  # FVEvaluation of the clean prompts
    corrupted: object = None  # FVEvaluation of the corrupted prompts
    reason: str = ""


def prepare_tasks(model, tokenizer, bos, pairs: dict, s: IclSettings, n_layers: int, n_heads: int) -> list[TaskRun]:
    """Per task its single-token pairs and (with enough of them) clean and corrupted prompts, seeded per task."""
    runs = []
    for i, (task, task_pairs) in enumerate(pairs.items()):
        usable = single_token_pairs(task_pairs, tokenizer)
        run = TaskRun(task, len(task_pairs), len(usable))
        if len(usable) < s.min_pairs:
            run.reason = f"{len(usable)} single-token pairs, fewer than min_pairs {s.min_pairs}"
        if len(usable) >= s.shots + 1:
            prompts = [build_prompts(task, usable, s.n_prompts, s.shots, tokenizer, bos,
                                     np.random.default_rng([s.seed, i, k]), shuffled=bool(k)) for k in (0, 1)]  # fmt: skip
            run.clean, run.corrupted = (
                fv_evaluation(model, p.ids, p.target, s.batch_size, n_layers, n_heads) for p in prompts
            )
        runs.append(run)
    return runs


def task_table(model_name: str, runs: list[TaskRun], s: IclSettings) -> tuple[pd.DataFrame, dict]:
    """The task table and, per used task, its heads' mean outputs at the last clean position [L, H, d]."""
    rows, means = [], {}
    for run in runs:
        row = {"model": model_name, "task": run.task, "n_pairs": run.n_pairs, "n_single_token": run.n_single_token,
               "n_prompts": s.n_prompts, "shots": s.shots, "used": False, "reason": run.reason}  # fmt: skip
        if run.clean is not None:
            clean, bad = run.clean.run(), run.corrupted.run()
            counts = resample_counts(np.random.default_rng(s.seed), run.clean.n_sequences, s.bootstrap)
            m, lo, hi = mean_ci(clean["correct"], counts, s.ci)
            row.update(accuracy=m[0], accuracy_ci_low=lo[0], accuracy_ci_high=hi[0], p_target=clean["loss"].mean(),
                       corrupted_accuracy=bad["correct"].mean(), p_target_corrupted=bad["loss"].mean())  # fmt: skip
            if not run.reason and m[0] < s.min_accuracy:
                run.reason = row["reason"] = f"{s.shots}-shot accuracy {m[0]:.2f} below min_accuracy {s.min_accuracy}"
            if not run.reason:
                row["used"] = True
                means[run.task] = run.clean.last_outputs().astype(np.float64).mean(0)
        elif not run.reason:
            run.reason = row["reason"] = f"fewer than {s.shots + 1} single-token pairs"
        rows.append(row)
    return pd.DataFrame(rows, columns=TASK_COLUMNS), means


def pooled(model, evs: list, s: IclSettings, n_layers: int, n_heads: int):
    """One evaluation of the prompts of several evaluations, and each prompt's index into ``evs`` [S]."""
    ids, target, task_of = [], [], []
    for t, ev in enumerate(evs):
        for inputs, y, _ in ev.batches:
            ids += inputs["input_ids"].tolist()
            target += y.tolist()
            task_of += [t] * len(y)
    return fv_evaluation(model, ids, np.asarray(target), s.batch_size, n_layers, n_heads), np.asarray(task_of)


def pooled_corrupted(model, runs: list[TaskRun], means: dict, s: IclSettings, n_layers: int, n_heads: int):
    """One evaluation of every used task's corrupted prompts, with each prompt's task means as its replacement."""
    used = [r for r in runs if r.task in means]
    ev, task_of = pooled(model, [r.corrupted for r in used], s, n_layers, n_heads)
    ev.values = TaskMeans(np.stack([means[r.task] for r in used]).astype(np.float32), task_of)
    return ev


def fv_heads(model_name: str, ev, s: IclSettings, tasks: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The head table (AIE, CI, kind, null) and the check table (estimate against exact values)."""
    L, H = ev.n_layers, ev.n_heads
    a = s.ablation()
    means = ev.values
    main, check = head_tables(model_name, ev, a)
    ev.values = means.permuted(donors(L * H, s.seed))
    null, null_check = head_tables(model_name, ev, a)
    ev.values = means
    null_aie = null["effect"].to_numpy(float)
    ref = np.sort(null_aie[np.isfinite(null_aie)])
    aie = main["effect"].to_numpy(float)
    below = (np.searchsorted(ref, aie, "left") + np.searchsorted(ref, aie, "right")) / 2
    q = np.quantile(ref, s.ci) if len(ref) else np.nan
    order = np.argsort(-np.nan_to_num(aie, nan=-np.inf), kind="stable")
    rank = np.empty(len(aie), int)
    rank[order] = np.arange(1, len(aie) + 1)
    heads = pd.DataFrame({
        "model": model_name, "layer": main["layer"], "head": main["head"],
        "label": [head_label(x, y) for x, y in zip(main["layer"], main["head"])], "aie": aie,
        "ci_low": main["ci_low"], "ci_high": main["ci_high"], "kind": main["kind"], "method": main["method"],
        "estimate": main["estimate"], "exact": main["exact"], "exact_ci_low": main["exact_ci_low"],
        "exact_ci_high": main["exact_ci_high"], "null_aie": null_aie,
        "null_quantile": np.where(np.isfinite(aie), below / max(len(ref), 1), np.nan),
        "above_null": main["ci_low"].to_numpy(float) > q, "rank": np.where(np.isfinite(aie), rank, -1),
        "top": np.isfinite(aie) & (rank <= s.top_k), "p_corrupted": main["intact"], "n_prompts": ev.n_sequences,
        "tasks": ",".join(tasks),
    }, columns=HEAD_COLUMNS)  # fmt: skip
    checks = pd.concat([c.assign(replacement=r) for c, r in ((check, "task mean"), (null_check, "null"))])
    checks = checks.assign(model=model_name, n_prompts=ev.n_sequences).reindex(columns=CHECK_COLUMNS)
    return heads, checks.reset_index(drop=True)


def skipped_heads(model_name: str, reason: str, n_layers: int, n_heads: int) -> pd.DataFrame:
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({"model": model_name, "layer": layer, "head": head,
                         "label": [head_label(a, b) for a, b in zip(layer, head)], "kind": f"skipped: {reason}",
                         "method": "skipped"}, columns=HEAD_COLUMNS)  # fmt: skip


def icl_tables(model_name: str, model, tokenizer, bos, pairs: dict, s: IclSettings, n_layers: int, n_heads: int):
    """Rule icl_heads: (tasks, heads, check) tables of one decoder."""
    runs = prepare_tasks(model, tokenizer, bos, pairs, s, n_layers, n_heads)
    tasks, means = task_table(model_name, runs, s)
    for r in tasks.itertuples():
        log.info("model %s, task %s: %d of %d pairs single-token, accuracy %s%s", model_name, r.task,
                 r.n_single_token, r.n_pairs, f"{r.accuracy:.3f}" if pd.notna(r.accuracy) else "-",
                 "" if r.used else f" (not used: {r.reason})")  # fmt: skip
    if not means:
        reason = "no task passes min_pairs and min_accuracy"
        log.warning("model %s: %s", model_name, reason)
        check = pd.DataFrame([{"model": model_name, "scope": f"skipped: {reason}"}], columns=CHECK_COLUMNS)
        return tasks, skipped_heads(model_name, reason, n_layers, n_heads), check
    ev = pooled_corrupted(model, runs, means, s, n_layers, n_heads)
    heads, check = fv_heads(model_name, ev, s, list(means))
    for r in check[check["scope"] == "exact heads"].itertuples():
        log.info("model %s (%s): atp vs exact on %d heads: spearman %.3f, top-%d overlap %d", model_name,
                 r.replacement, r.n_compared, r.spearman, r.top_k, r.top_k_overlap)  # fmt: skip
    log.info("model %s: kinds %s; top heads %s", model_name, heads["kind"].value_counts().to_dict(),
             ", ".join(heads.sort_values("rank").loc[heads["top"], "label"]))  # fmt: skip
    return tasks, heads, check


def load_decoder(spec, cache_dir, device: str):
    """(model, tokenizer, bos, (layers, heads)) of a decoder with its causal-LM head, or (None, reason)."""
    from transformers import AutoConfig, AutoTokenizer

    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    kind = model_kind(config, spec)
    shape = (int(config.num_hidden_layers), int(config.num_attention_heads))
    if kind != "decoder":
        return None, "an encoder: function-vector heads are measured on next-token prediction", shape
    model, reason = lm_head_model(loc, kind, kwargs, spec, device)  # on device, or split by its device_map
    if model is None:
        return None, reason, shape
    model.config.use_cache = False  # no key/value cache: batches are expanded inside the model
    tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
    return (model, tokenizer, decoder_bos(tokenizer, config, spec)), None, shape


def skipped_tables(model_name: str, reason: str, tasks: list[str], n_layers: int, n_heads: int):
    """The three tables of a model that is not measured, the reason on every row."""
    t = pd.DataFrame({"model": model_name, "task": tasks, "used": False, "reason": reason}, columns=TASK_COLUMNS)
    check = pd.DataFrame([{"model": model_name, "scope": f"skipped: {reason}"}], columns=CHECK_COLUMNS)
    return t, skipped_heads(model_name, reason, n_layers, n_heads), check


# the atlas columns the FV AIE is compared with: column -> what it is
AGREEMENT_SCORES = {
    "det_induction": "induction score (detectors)",
    "det_prev": "previous-token score (detectors)",
    "det_sink": "sink score alpha_1 (detectors)",
    "circ_retrieval": "retrieval score (circuits)",
    "ablation_lm_loss_effect": "mean-ablation loss effect (ablation)",
}
AGREEMENT_COLUMNS = ["model", "score", "what", "n_heads", "spearman", "ci_low", "ci_high", "p", "top_k",
                     "top_k_overlap", "top_k_jaccard", "top_k_chance", "shared_top_heads"]  # fmt: skip


def agreement_table(heads: pd.DataFrame, atlas: pd.DataFrame, k: int, n_boot: int, seed: int) -> pd.DataFrame:
    """The FV AIE (exact and checked values) against every score of :data:`AGREEMENT_SCORES` the atlas has: Spearman's
    rho with a bootstrap CI over heads, and the overlap of the two top-k sets (largest values) with its chance level."""
    shown = heads["kind"].isin(["exact", "estimated (checked)"])
    fv = heads.assign(fv=heads["aie"].where(shown))[["layer", "head", "fv"]]
    both = fv.merge(atlas, on=["layer", "head"], how="left")
    x = both["fv"].to_numpy(float)
    model = str(heads["model"].iloc[0]) if len(heads) else ""
    rows = []
    for col, what in AGREEMENT_SCORES.items():
        if col not in both:
            continue
        y = pd.to_numeric(both[col], errors="coerce").to_numpy(float)
        rho, lo, hi, p, n = spearman_ci(x, y, n_boot, seed)
        overlap, jac, chance = topk_overlap(x, y, k)
        ok = both.loc[np.isfinite(x) & np.isfinite(y)]
        shared = sorted({(a, b) for a, b in zip(*ok.nlargest(k, "fv")[["layer", "head"]].to_numpy().T)}
                        & {(a, b) for a, b in zip(*ok.nlargest(k, col)[["layer", "head"]].to_numpy().T)})  # fmt: skip
        rows.append({"model": model, "score": col, "what": what, "n_heads": n, "spearman": rho, "ci_low": lo,
                     "ci_high": hi, "p": p, "top_k": k, "top_k_overlap": overlap, "top_k_jaccard": jac,
                     "top_k_chance": chance, "shared_top_heads": ",".join(head_label(a, b) for a, b in shared)})  # fmt: skip
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
