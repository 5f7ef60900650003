"""The exclusion test of Yin & Steinhardt (2025, "Which attention heads matter for in-context learning?").

Two head sets, each of ``n = max(1, round(share * heads))`` heads:

- FV heads: the ``n`` heads of largest AIE (:mod:`headatlas.icl.analysis`, exact or checked values only) among
  the heads that are not in the top ``n`` by induction score;
- induction heads: the ``n`` heads of largest induction score (the detectors' main induction row) among the
  heads that are not in the top ``n`` by AIE.

The other kind's top ``n`` is removed from the ranking before the top ``n`` is taken (their
``get_heads_to_ablate`` with ``exclude_other_heads``), so each set keeps ``n`` heads and holds none of the other
kind's top heads; a head in both top lists is in neither set. Ties go to the lower flat index (layer, then head);
heads without a value are never picked.

Each set is mean-ablated jointly (every head at every position, by its mean output over every token of the
evaluation's own inputs; :meth:`headatlas.ablation.tasks.Evaluation.run`) and two things are measured:

- ``icl_accuracy``: the ``shots``-shot accuracy on the clean prompts of the tasks the FV scores use (the head
  table's ``tasks``); effect = intact - ablated accuracy;
- ``icl_score``: Olsson et al.'s in-context learning score on running WikiText text, the loss of token ``late``
  minus the loss of token ``early`` (0-based positions of the input, BOS included); effect = ablated - intact
  score. Yin & Steinhardt report the sign-flipped difference (loss at 50 minus loss at 500).

So a positive effect is harm to in-context learning in both. Each set is compared with ``random_sets`` random sets
with the same number of heads in every layer, drawn outside both sets and both top lists
(:func:`headatlas.ablation.analysis.matched_random_sets`): the random effects' mean, SD and range, the set's rank
among them (1: the most harmful) and ``rank_p`` = (1 + random sets at least as harmful) / (1 + random sets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..ablation.analysis import matched_random_sets, mean_ci
from ..ablation.patch import HeadPatch, replacement
from ..ablation.tasks import Evaluation
from ..core.bootstrap import resample_counts
from ..core.corpora import wiki_long_segments
from ..core.device import input_device
from ..core.figures import head_label
from ..core.settings import Settings
from .analysis import IclSettings, pooled, prepare_tasks
from .figures import induction_scores

log = logging.getLogger("headatlas.icl.exclusion")

SETS = ("fv", "induction")
METRICS = ("icl_accuracy", "icl_score")
SHOWN_KINDS = ("exact", "estimated (checked)")  # the AIE values the sets are ranked by
COLUMNS = ["model", "set", "metric", "status", "n_heads", "heads", "per_layer", "excluded", "intact", "ablated",
           "effect", "ci_low", "ci_high", "random_mean", "random_sd", "random_min", "random_max", "n_random_sets",
           "rank", "rank_p", "n_items", "detail"]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ExclusionSettings(Settings):
    """analysis.icl.exclusion (workflow/schemas/icl.schema.yaml); the prompts, bootstrap, CI and seed are
    analysis.icl's own."""

    SECTION = "analysis.icl.exclusion"

    share: float = 0.02
    random_sets: int = 10
    n_texts: int = 16
    early: int = 50
    late: int = 500
    text_batch_size: int = 4

    def __post_init__(self):
        if not 1 <= self.early < self.late:
            raise ValueError(f"config key {self.SECTION}: early ({self.early}) must be at least 1 and below late "
                             f"({self.late})")  # fmt: skip


# --- the head sets ---------------------------------------------------------------------------------------


def ranking(scores: np.ndarray) -> np.ndarray:
    """Flat head indices with a value, largest score first (ties: lower index first)."""
    ok = np.flatnonzero(np.isfinite(scores))
    return ok[np.argsort(-scores[ok], kind="stable")]


def exclusion_sets(fv: np.ndarray, induction: np.ndarray, share: float) -> dict:
    """The two sets from flat scores [L * H] (NaN: no value). Returns ``n``, per kind its ``top`` (the top n by
    its own score) and its ``set`` (the top n outside the other kind's top n), both as flat index arrays in
    ranking order, and ``overlap`` (the heads in both top lists, sorted)."""
    n = max(1, int(round(share * fv.size)))
    order = {"fv": ranking(fv), "induction": ranking(induction)}
    top = {k: o[:n] for k, o in order.items()}
    out = {"n": n, "overlap": np.intersect1d(top["fv"], top["induction"])}
    for k, other in (("fv", "induction"), ("induction", "fv")):
        out[k] = {"top": top[k], "set": order[k][~np.isin(order[k], top[other])][:n]}
    return out


def random_draws(sets: dict, n_layers: int, n_heads: int, n_draws: int, seed: int) -> dict[str, list[np.ndarray]]:
    """Per kind ``n_draws`` flat head sets with its set's per-layer counts, outside both sets and both top lists."""
    pairs = lambda flat: [(int(f // n_heads), int(f % n_heads)) for f in flat]  # noqa: E731
    exclude = pairs(np.unique(np.concatenate([sets[k][p] for k in SETS for p in ("top", "set")])))
    out = {}
    for i, k in enumerate(SETS):
        rng = np.random.default_rng([seed, 42, i])
        draws = matched_random_sets(pairs(sets[k]["set"]), n_heads, n_draws, rng, exclude=exclude)
        out[k] = [np.array([lay * n_heads + h for lay, h in d], dtype=np.int64) for d in draws]
    return out


def head_mask(flat: np.ndarray, n_layers: int, n_heads: int) -> np.ndarray:
    m = np.zeros(n_layers * n_heads, bool)
    m[np.asarray(flat, dtype=np.int64)] = True
    return m.reshape(n_layers, n_heads)


# --- the measurements ------------------------------------------------------------------------------------


class TokenLossEvaluation(Evaluation):
    """Running text of ``late + 1`` tokens per row (no padding); per sequence the loss of token ``early`` and of
    token ``late``, in the slots ``loss`` (late) and ``correct`` (early) of :meth:`Evaluation.run`."""

    positions: tuple[int, int] = (0, 0)

    def _metrics(self, out, targets):
        early, late = self.positions
        logits = out.logits.float()
        if logits.shape[1] not in (2, targets.shape[1]):
            raise RuntimeError(f"logits of {logits.shape[1]} positions, not 2 or {targets.shape[1]}")
        if logits.shape[1] != 2:  # all positions (a model without logits_to_keep)
            logits = logits[:, [early - 1, late - 1]]
        lp = logits.log_softmax(-1)
        loss = -lp.gather(2, targets[:, [early, late], None])[..., 0]  # [B, 2]
        return loss[:, 1], loss[:, 0]

    def _out(self, loss, correct) -> dict[str, np.ndarray]:
        return {"late": loss, "early": correct}


def token_positions(s: ExclusionSettings, max_tokens: int | None) -> tuple[int, int]:
    """(early, late) as configured, or scaled down together where late + 1 tokens exceed the model's configured
    input length ``max_tokens``: late = max_tokens - 1, early in the same ratio (at least 1, below late)."""
    if max_tokens is None or s.late + 1 <= max_tokens:
        return s.early, s.late
    if max_tokens < 3:
        raise ValueError(f"an input length of {max_tokens} tokens leaves no early and late token")
    late = max_tokens - 1
    return min(max(1, round(s.early * late / s.late)), late - 1), late


def text_evaluation(model, tokenizer, bos, text: str, s: ExclusionSettings, positions: tuple[int, int], seed: int,
                    n_layers: int, n_heads: int):  # fmt: skip
    """A :class:`TokenLossEvaluation` of ``n_texts`` windows of running WikiText text (seeded), cut to ``late + 1``
    tokens (BOS first where the model uses one); only the two logits it needs are computed where it can."""
    import inspect

    import torch

    early, late = positions
    n = late + 1
    records = wiki_long_segments(text, s.n_texts, n, seed)
    ids = []
    for r in records:
        t = tokenizer(" ".join(r.words), add_special_tokens=False)["input_ids"]
        ids.append(([bos] if bos is not None else []) + list(t))
    ids = [t[:n] for t in ids if len(t) >= n]
    if not ids:
        raise ValueError(f"{text}: no window of running text gives {n} tokens (analysis.icl.exclusion.late)")
    device = input_device(model)
    keep = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        keep["logits_to_keep"] = torch.tensor([early - 1, late - 1], device=device)
    batches = []
    for i in range(0, len(ids), s.text_batch_size):
        x = torch.as_tensor(ids[i : i + s.text_batch_size], dtype=torch.long, device=device)
        inputs = {"input_ids": x, "attention_mask": torch.ones_like(x), **keep}
        batches.append((inputs, x, np.arange(i, i + len(x))))
    ev = TokenLossEvaluation("lm", model, batches, len(ids), n_layers, n_heads)
    ev.positions = positions
    return ev


def every_position(ev: Evaluation) -> Evaluation:
    """``ev`` with the ablation's own patch (every position) in place of the ICL patch (the last one only)."""
    ev.patch = HeadPatch(ev.patch.modules, ev.n_heads, ev.patch.layers)
    return ev


def ablated_runs(ev: Evaluation, masks: list[np.ndarray], metric) -> tuple[np.ndarray, np.ndarray]:
    """Per item the metric intact [S] and with each mask's heads mean-ablated jointly [len(masks), S]; the mean
    is every head's mean output over every token of ``ev``'s inputs."""
    values = replacement(ev.mean_vectors(), "mean")
    intact = metric(ev.run())
    return intact, np.stack([metric(ev.run(m, values)) for m in masks]) if masks else np.zeros((0, len(intact)))


# --- the table -------------------------------------------------------------------------------------------


def per_layer(flat: np.ndarray, n_heads: int) -> str:
    layers, counts = np.unique(np.asarray(flat, dtype=np.int64) // n_heads, return_counts=True)
    return " ".join(f"L{a + 1}:{c}" for a, c in zip(layers, counts))


def labels(flat, n_heads: int) -> str:
    return " ".join(head_label(f // n_heads, f % n_heads) for f in np.asarray(flat, dtype=np.int64))


def compare(intact: np.ndarray, target: np.ndarray, randoms: np.ndarray, sign: float, icl: IclSettings) -> dict:
    """The targeted set's effect (``sign`` * (ablated - intact), mean over items, bootstrap CI) against the random
    sets' effects [R]: mean, SD, range, its rank (1: most harmful) and rank_p."""
    counts = resample_counts(np.random.default_rng([icl.seed, 43]), len(intact), icl.bootstrap)
    m, lo, hi = mean_ci(sign * (target - intact), counts, icl.ci)
    eff = float(m[0])
    r = sign * (randoms.mean(1) - intact.mean()) if len(randoms) else np.zeros(0)
    beats = int((r >= eff - 1e-12).sum())
    return {"intact": float(intact.mean()), "ablated": float(target.mean()), "effect": eff, "ci_low": float(lo[0]),
            "ci_high": float(hi[0]), "random_mean": float(r.mean()) if len(r) else np.nan,
            "random_sd": float(r.std(ddof=1)) if len(r) > 1 else np.nan,
            "random_min": float(r.min()) if len(r) else np.nan, "random_max": float(r.max()) if len(r) else np.nan,
            "n_random_sets": len(r), "rank": 1 + int((r > eff + 1e-12).sum()),
            "rank_p": (1 + beats) / (1 + len(r)) if len(r) else np.nan, "n_items": len(intact)}  # fmt: skip


def flat_scores(heads: pd.DataFrame, detectors: pd.DataFrame | None, n_layers: int, n_heads: int):
    """(AIE, induction score) as flat [L * H] arrays (NaN where a head has no exact or checked value)."""
    fv = np.full(n_layers * n_heads, np.nan)
    shown = heads[heads["kind"].isin(SHOWN_KINDS)]
    fv[shown["layer"].to_numpy(int) * n_heads + shown["head"].to_numpy(int)] = shown["aie"].to_numpy(float)
    ind = induction_scores(detectors)
    if ind is None:
        return fv, None
    out = np.full(n_layers * n_heads, np.nan)
    out[ind["layer"].to_numpy(int) * n_heads + ind["head"].to_numpy(int)] = ind["mean"].to_numpy(float)
    return fv, out


def skipped_table(model_name: str, reason: str) -> pd.DataFrame:
    rows = [{"model": model_name, "set": k, "metric": m, "status": f"skipped: {reason}"} for k in SETS for m in METRICS]
    return pd.DataFrame(rows, columns=COLUMNS)


def skip_reason(heads: pd.DataFrame, detectors: pd.DataFrame | None) -> str:
    """Why a model gets no exclusion test ('' when it gets one)."""
    if not heads["kind"].isin(SHOWN_KINDS).any():
        kinds = heads["kind"].astype(str)
        skipped = kinds[kinds.str.startswith("skipped: ")]
        return skipped.iloc[0][len("skipped: ") :] if len(skipped) else "no exact or checked FV score"
    if induction_scores(detectors) is None:
        return "no induction score (analysis.detectors does not cover the model)"
    return ""


def exclusion_table(model_name: str, loaded, pairs: dict, heads: pd.DataFrame, detectors: pd.DataFrame | None,
                    text: str, icl: IclSettings, s: ExclusionSettings, n_layers: int, n_heads: int,
                    max_tokens: int | None = None) -> pd.DataFrame:  # fmt: skip
    """Rule icl_exclusion: the exclusion test of one decoder (``loaded``: model, tokenizer, bos; ``max_tokens``:
    its configured input length, :func:`token_positions`)."""
    model, tokenizer, bos = loaded
    L, H = n_layers, n_heads
    fv, ind = flat_scores(heads, detectors, L, H)
    sets = exclusion_sets(fv, ind, s.share)
    draws = random_draws(sets, L, H, s.random_sets, icl.seed)
    log.info("model %s: n = %d heads per set; FV set %s; induction set %s; in both top lists: %s", model_name,
             sets["n"], labels(sets["fv"]["set"], H), labels(sets["induction"]["set"], H),
             labels(sets["overlap"], H) or "none")  # fmt: skip
    flat = [sets[k]["set"] for k in SETS] + [d for k in SETS for d in draws[k]]
    masks = [head_mask(f, L, H) for f in flat]
    R = s.random_sets
    early, late = token_positions(s, max_tokens)
    if (early, late) != (s.early, s.late):
        log.warning("model %s: input length %d: tokens %d and %d in place of %d and %d", model_name, max_tokens,
                    early, late, s.early, s.late)  # fmt: skip
    ev = text_evaluation(model, tokenizer, bos, text, s, (early, late), icl.seed, L, H)
    intact, abl = ablated_runs(ev, masks, lambda o: o["late"] - o["early"])
    results = {"icl_score": (intact, abl, 1.0, f"loss at token {late} - token {early}, {ev.n_sequences} texts")}
    tasks = [t for t in str(heads["tasks"].dropna().iloc[0]).split(",") if t] if heads["tasks"].notna().any() else []
    runs = [
        r for r in prepare_tasks(model, tokenizer, bos, pairs, icl, L, H) if r.task in tasks and r.clean is not None
    ]
    if runs:
        ev, _ = pooled(model, [r.clean for r in runs], icl, L, H)
        intact, abl = ablated_runs(every_position(ev), masks, lambda o: o["correct"])
        detail = f"{icl.shots}-shot, {ev.n_sequences} prompts of {','.join(r.task for r in runs)}"
        results["icl_accuracy"] = (intact, abl, -1.0, detail)
    rows = []
    for i, k in enumerate(SETS):
        head_info = {"n_heads": len(sets[k]["set"]), "heads": labels(sets[k]["set"], H),
                     "per_layer": per_layer(sets[k]["set"], H),
                     "excluded": labels(np.setdiff1d(sets[k]["top"], sets[k]["set"]), H)}  # fmt: skip
        for metric in METRICS:
            row = {"model": model_name, "set": k, "metric": metric, **head_info}
            if metric not in results:
                row["status"] = "skipped: none of the FV table's tasks has prompts"
            else:
                intact, abl, sign, detail = results[metric]
                rand = abl[2 + i * R : 2 + (i + 1) * R]
                row.update(status="ok", detail=detail, **compare(intact, abl[i], rand, sign, icl))
            rows.append(row)
    table = pd.DataFrame(rows, columns=COLUMNS)
    for r in table[table["status"] == "ok"].itertuples():
        log.info("model %s, %s heads, %s: effect %.4f (%.4f-%.4f), random %.4f +- %.4f, rank %d of %d, p %.3f",
                 model_name, r.set, r.metric, r.effect, r.ci_low, r.ci_high, r.random_mean, r.random_sd, r.rank,
                 r.n_random_sets + 1, r.rank_p)  # fmt: skip
    return table
