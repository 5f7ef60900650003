"""A causal check of the induction mechanism: do the induction heads need the previous-token heads?

The top previous-token heads of the detectors' table (on natural text, significant, by mean score) in layers below
the deepest of the top induction heads (on the repeated random sequences, significant) are mean-ablated together
at the output projection (:class:`headatlas.ablation.patch.HeadPatch`, their mean vectors over every real token of
the same inputs), and the induction heads' induction scores are measured again on the detectors' repeated random
sequences (:func:`headatlas.detectors.sequences.random_inputs`, :class:`headatlas.detectors.reducers.DetectorReducer`:
one implementation of each). The drop (intact - ablated, mean over the induction heads, per sequence; bootstrap CI
over sequences) is compared with seeded random head sets with as many heads in every layer
(:func:`headatlas.ablation.analysis.matched_random_sets`, the role ablation's matched null): ``rank_p`` = (1 + sets
with a drop at least as large) / (1 + sets).

Whether the weights point at the same partners: per induction head, the K-composition z (random-orientation null,
:mod:`headatlas.circuits.weights`) of every head in an earlier layer, the mean percentile of the ablated heads among
them and the Spearman correlation between K-composition and the previous-token score over those heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..ablation.analysis import matched_random_sets
from ..ablation.patch import HeadPatch
from ..core.batching import length_batches, model_inputs
from ..core.bootstrap import bootstrap_ci
from ..core.extract import head_output_modules
from ..core.figures import head_label
from ..core.io import flags
from ..core.reduce import fused_reduce
from ..core.settings import Settings
from ..detectors.reducers import DetectorReducer
from ..detectors.registry import column


@dataclass(frozen=True, kw_only=True)
class InductionSettings(Settings):
    """analysis.circuits.induction (workflow/schemas/circuits.schema.yaml); bootstrap, ci and seed are
    analysis.circuits's own."""

    SECTION = "analysis.circuits.induction"
    PARENT_KEYS = ("bootstrap", "ci", "seed")

    n_prev: int = 4
    n_induction: int = 4
    n_sequences: int = 16
    random_sets: int = 10
    bootstrap: int = 1000
    ci: float = 0.95
    seed: int = 0


def pick_heads(detectors: pd.DataFrame, n_prev: int, n_induction: int) -> tuple[list, list]:
    """(previous-token heads, induction heads) as (layer, head) lists from a detectors heads.tsv: the top
    ``n_induction`` significant induction heads on their main input, then the top ``n_prev`` significant
    previous-token heads in layers below the deepest of them (either list may come out shorter, or empty)."""
    main = detectors[flags(detectors["main"])]
    sig = main[flags(main["significant"])]
    ind = sig[sig["detector"] == "induction"].sort_values("mean", ascending=False, kind="stable").head(n_induction)
    if not len(ind):
        return [], []
    prev = sig[(sig["detector"] == "prev") & (sig["layer"] < ind["layer"].max())]
    keys = set(zip(ind["layer"], ind["head"]))
    prev = prev[[k not in keys for k in zip(prev["layer"], prev["head"])]]
    prev = prev.sort_values("mean", ascending=False, kind="stable").head(n_prev)
    as_list = lambda t: [(int(a), int(b)) for a, b in zip(t["layer"], t["head"])]  # noqa: E731
    return as_list(prev), as_list(ind)


def head_means(model, tokenized, batch_size: int, pad_id: int, patch) -> np.ndarray:
    """Every head's mean output vector [L, H, d] over the real tokens of ``tokenized`` (the ablation values)."""
    import torch

    sums, count = 0.0, 0
    with patch, torch.inference_mode():
        patch.capture = True
        try:
            for pos in length_batches([len(t) for t in tokenized], batch_size):
                patch.reset()
                inputs = model_inputs([tokenized[p] for p in pos], model, pad_id)
                model(**inputs)
                real = inputs["attention_mask"].bool()
                z = torch.stack([t.reshape(*real.shape, patch.n_heads, -1) for t in patch.captured], 1)
                sums = sums + (z.double() * real[:, None, :, None, None]).sum((0, 2)).cpu().numpy()
                count += int(real.sum())
        finally:
            patch.capture = False
            patch.reset()
    return sums / max(count, 1)


def induction_scores(model, tokenized, batch_size, kind, pad_id, name, patch=None, mask=None, values=None):
    """The detectors' induction score [N, L, H] of every sequence and head, with heads ``mask`` [L, H] replaced by
    ``values`` when given."""
    from contextlib import nullcontext

    ctx = nullcontext() if mask is None else patch
    with ctx:
        patch_ctx = nullcontext() if mask is None else patch.ablated(mask, values)
        with patch_ctx:
            if patch is not None:
                patch.reset()
            res = fused_reduce(model, tokenized, [DetectorReducer(0)], batch_size, kind, None, pad_id, name, "circuits")
    return res[0]["scores"][..., column("induction")]


def _mask(heads, n_layers: int, n_heads: int) -> np.ndarray:
    m = np.zeros((n_layers, n_heads), dtype=bool)
    for layer, h in heads:
        m[layer, h] = True
    return m


def ablation_check(model, tokenized, kind: str, pad_id: int, name: str, detectors: pd.DataFrame,
                   settings: InductionSettings, batch_size: int = 16) -> dict:  # fmt: skip
    """Intact, previous-token-ablated and matched-random-ablated induction scores of the induction heads.
    Returns ``prev``, ``induction`` (head lists), ``intact`` [N, I], ``ablated`` [N, I], ``random`` [R, N, I]
    and ``random_sets``; empty head lists when the detectors found none."""
    s = settings
    n_layers, n_heads = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    prev, ind = pick_heads(detectors, s.n_prev, s.n_induction)
    out = {"prev": prev, "induction": ind, "random_sets": []}
    if not prev or not ind:
        return out
    patch = HeadPatch(head_output_modules(model, n_layers), n_heads)
    means = head_means(model, tokenized, batch_size, pad_id, patch)
    cols = tuple(np.array(ind).T)
    pick = lambda x: x[:, cols[0], cols[1]]  # noqa: E731
    out["intact"] = pick(induction_scores(model, tokenized, batch_size, kind, pad_id, name))
    run = lambda heads: pick(  # noqa: E731
        induction_scores(
            model, tokenized, batch_size, kind, pad_id, name, patch, _mask(heads, n_layers, n_heads), means
        )
    )
    out["ablated"] = run(prev)
    sets = matched_random_sets(prev, n_heads, s.random_sets, np.random.default_rng([s.seed, 25]))
    out["random_sets"] = sets
    out["random"] = np.stack([run(r) for r in sets]) if sets else np.zeros((0,) + out["intact"].shape)
    return out


def ablation_tables(result: dict, model: str, settings: InductionSettings, comp: dict | None,
                    prev_scores: np.ndarray | None, n_heads: int) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(summary, per induction head). ``comp``: :func:`headatlas.circuits.weights.composition` (or None);
    ``prev_scores`` [L, H] the detectors' previous-token means."""
    s = settings
    prev, ind = result["prev"], result["induction"]
    label = lambda hs: " ".join(head_label(a, b) for a, b in hs)  # noqa: E731
    if not prev or not ind:
        why = "no significant induction head" if not ind else "no significant previous-token head below them"
        return pd.DataFrame([{"model": model, "status": "skipped", "reason": why}]), pd.DataFrame()
    intact, ablated, rand = result["intact"], result["ablated"], result["random"]
    ok = np.isfinite(intact).all(1) & np.isfinite(ablated).all(1)
    drop = (intact - ablated)[ok].mean(1)  # per sequence
    lo, hi = bootstrap_ci(drop, n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, 26]))
    rdrop = (intact[None] - rand)[:, ok].mean((1, 2)) if len(rand) else np.zeros(0)
    obs = float(drop.mean())
    summary = {
        "model": model, "status": "ok", "reason": "", "prev_heads": label(prev), "induction_heads": label(ind),
        "n_sequences": int(ok.sum()), "intact": float(intact[ok].mean()), "ablated": float(ablated[ok].mean()),
        "drop": obs, "drop_ci_low": float(lo[0]), "drop_ci_high": float(hi[0]),
        "relative_drop": obs / float(intact[ok].mean()) if intact[ok].mean() else np.nan,
        "random_drop_mean": float(rdrop.mean()) if len(rdrop) else np.nan,
        "random_drop_max": float(rdrop.max()) if len(rdrop) else np.nan,
        "n_random_sets": len(rdrop),
        "rank_p": float((1 + (rdrop >= obs - 1e-12).sum()) / (1 + len(rdrop))) if len(rdrop) else np.nan,
    }  # fmt: skip
    summary["needs_prev_heads"] = bool(lo[0] > 0 and len(rdrop) and summary["rank_p"] <= 0.1)
    rows = []
    for j, (layer, h) in enumerate(ind):
        d = intact[ok, j] - ablated[ok, j]
        dlo, dhi = bootstrap_ci(d, n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, 27, j]))
        row = {"model": model, "layer": layer, "head": h, "label": head_label(layer, h),
               "intact": float(intact[ok, j].mean()), "ablated": float(ablated[ok, j].mean()), "drop": float(d.mean()),
               "drop_ci_low": float(dlo[0]), "drop_ci_high": float(dhi[0]),
               "random_drop_mean": float((intact[None, ok, j] - rand[:, ok, j]).mean()) if len(rand) else np.nan}  # fmt: skip
        if comp is not None:
            kz = comp["z"][1][:, layer * n_heads + h].reshape(-1, n_heads)[:layer]  # writers in earlier layers
            seen = np.flatnonzero(kz.ravel() != -np.inf)  # the scored writers (composition.max_layer_gap)
            flat = kz.ravel()[seen]
            pct = [float((flat < kz[a, b]).mean()) for a, b in prev if a < layer and kz[a, b] != -np.inf]
            row["k_comp_prev_percentile"] = float(np.mean(pct)) if pct else np.nan
            top = seen[np.argsort(-flat, kind="stable")[: len(prev)]]
            row["k_comp_top"] = " ".join(head_label(i // n_heads, i % n_heads) for i in top)
            row["k_comp_top_overlap"] = int(len({(int(i // n_heads), int(i % n_heads)) for i in top} & set(prev)))
            if prev_scores is not None and layer >= 1 and flat.size > 2:
                from scipy import stats

                row["k_comp_prev_spearman"] = float(stats.spearmanr(flat, prev_scores[:layer].ravel()[seen])[0])
        rows.append(row)
    return pd.DataFrame([summary]), pd.DataFrame(rows)
