"""The circuits tables of one model: composition pairs and their summary, per-head copying / successor /
composition scores, the induction ablation check, retrieval / echo / long-range induction scores, the per-head
join the atlas reads (columns ``circ_*``) and the agreement between detectors.

Significance: copying, negative copying and successor shares are tested one-sided against chance with the
binomial distribution (k / T for the top-k / bottom-k of T tokens; the mean of 1 / task size for successors),
FDR over the heads of one model and score; CIs are percentile bootstraps over tokens (copying, successor), over
answered runs (retrieval) or over sequences (echo, induction)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.agreement import spearman_ci, topk_overlap
from ..core.batching import pad_token
from ..core.bootstrap import bootstrap_ci
from ..core.figures import head_label
from ..core.io import flags
from ..core.models import decoder_bos, model_kind, resolve
from ..core.multitest import adjust
from ..core.settings import Settings
from ..detectors.sequences import random_inputs
from . import weights as W
from .induction import ablation_check, ablation_tables
from .longrange import (
    BIN_NAMES,
    chat_frame,
    layer_windows,
    long_range_scores,
    needle_inputs,
    retrieval_bins,
    retrieval_runs,
    top_share,
)

KEY = ["layer", "head"]


@dataclass(frozen=True, kw_only=True)
class CompositionSettings(Settings):
    """analysis.circuits.composition: the bounds of the composition scores (docs/plan.md, "Scaling rules")."""

    SECTION = "analysis.circuits.composition"

    max_layer_gap: int | None = None
    memory_gb: float = 4.0


@dataclass(frozen=True, kw_only=True)
class CircuitSettings(Settings):
    """analysis.circuits top-level keys (workflow/schemas/circuits.schema.yaml)."""

    SECTION = "analysis.circuits"

    n_tokens: int = 500
    top_k: int = 5
    seed: int = 0
    bootstrap: int = 1000
    ci: float = 0.95
    alpha: float = 0.05
    fdr_method: str = "fdr_bh"
    agreement_top_k: int = 10
    edges: int = 12
    composition: CompositionSettings = field(default_factory=CompositionSettings)


def _grid(n_layers: int, n_heads: int, model: str) -> pd.DataFrame:
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({"model": model, "layer": layer, "head": head,
                         "label": [head_label(a, b) for a, b in zip(layer, head)]})  # fmt: skip


# --- composition -------------------------------------------------------------------------------------------------


def composition_tables(comp: dict, model: str, n_layers: int, n_heads: int, d_eff: int,
                       settings: CircuitSettings) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(one row per scored pair (``comp["scored"]``: the causal pairs within the layer gap): score, z against random
    orientations, z against the model's scored pairs, FDR over them; one row per mode: the distribution beside the
    null)."""
    from scipy import stats  # here: the workflow imports this module when it plans (its settings)

    s = settings
    causal = comp["scored"]
    w, r = np.nonzero(causal)
    pairs = pd.DataFrame({"model": model, "writer_layer": w // n_heads, "writer_head": w % n_heads,
                          "reader_layer": r // n_heads, "reader_head": r % n_heads})  # fmt: skip
    pairs.insert(3, "writer", [head_label(a, b) for a, b in zip(pairs["writer_layer"], pairs["writer_head"])])
    pairs["reader"] = [head_label(a, b) for a, b in zip(pairs["reader_layer"], pairs["reader_head"])]
    rows = []
    null_mean = 1.0 / np.sqrt(d_eff)
    for mi, mode in enumerate(W.MODES):
        sc, z = comp["score"][mi][causal], comp["z"][mi][causal]
        p = stats.norm.sf(z)
        p_adj, sig = adjust(p, s.alpha, s.fdr_method)
        zh = (sc - sc.mean()) / sc.std(ddof=1) if len(sc) > 1 else np.full(len(sc), np.nan)
        pairs[f"comp_{mode}"], pairs[f"comp_{mode}_z"], pairs[f"comp_{mode}_z_heads"] = sc, z, zh
        pairs[f"comp_{mode}_p_adj"], pairs[f"comp_{mode}_sig"] = p_adj, sig
        best = int(np.argmax(z)) if len(z) else 0
        rows.append({"model": model, "mode": mode, "d_eff": d_eff, "null_mean": null_mean, "n_pairs": int(len(sc)),
                     "mean": float(sc.mean()) if len(sc) else np.nan, "sd": float(sc.std(ddof=1)) if len(sc) > 1 else np.nan,
                     "max": float(sc.max()) if len(sc) else np.nan,
                     "share_significant": float(sig.mean()) if len(sig) else np.nan,
                     "top_pair": f"{pairs['writer'].iloc[best]} -> {pairs['reader'].iloc[best]}" if len(z) else "",
                     "top_z": float(z[best]) if len(z) else np.nan})  # fmt: skip
    return pairs, pd.DataFrame(rows)


def composition_head_columns(comp: dict, n_layers: int, n_heads: int) -> pd.DataFrame:
    """Per head: per mode, the largest z over the heads it reads from (``circ_{m}_in_z``, from whom) and over the
    heads that read it (``circ_{m}_out_z``), among the scored pairs (``comp["scored"]``)."""
    n = n_layers * n_heads
    causal = comp["scored"]
    out = pd.DataFrame({"layer": np.arange(n) // n_heads, "head": np.arange(n) % n_heads})
    for mi, mode in enumerate(W.MODES):
        z = np.where(causal, comp["z"][mi], -np.inf)
        zin, zout = z.max(0), z.max(1)
        src, dst = z.argmax(0), z.argmax(1)
        out[f"circ_{mode}_in_z"] = np.where(np.isfinite(zin), zin, np.nan)
        out[f"circ_{mode}_in_from"] = [head_label(i // n_heads, i % n_heads) if np.isfinite(v) else ""
                                       for i, v in zip(src, zin)]  # fmt: skip
        out[f"circ_{mode}_out_z"] = np.where(np.isfinite(zout), zout, np.nan)
        out[f"circ_{mode}_out_to"] = [head_label(i // n_heads, i % n_heads) if np.isfinite(v) else ""
                                      for i, v in zip(dst, zout)]  # fmt: skip
    return out


# --- copying and successor ---------------------------------------------------------------------------------------


def _share_columns(hits: np.ndarray, chance: float, name: str, s: CircuitSettings, seed: int) -> dict:
    """hits [N, T] booleans -> share, bootstrap CI over tokens, binomial p vs ``chance``, FDR."""
    from scipy import stats  # here: the workflow imports this module when it plans (its settings)

    n = hits.shape[1]
    k = hits.sum(1)
    lo, hi = bootstrap_ci(
        hits.T.astype(float), n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, seed])
    )
    p = stats.binom.sf(k - 1, n, chance)
    _, sig = adjust(p, s.alpha, s.fdr_method)
    return {f"circ_{name}": k / n, f"circ_{name}_ci_low": lo, f"circ_{name}_ci_high": hi, f"circ_{name}_p": p,
            f"circ_{name}_sig": sig, f"circ_{name}_chance": chance}  # fmt: skip


def ov_head_columns(
    hw: W.HeadWeights, ext_fn, unembed: np.ndarray, tokenizer, s: CircuitSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per head copying, negative-copying and successor scores (columns ``circ_copying*``, ``circ_neg_copying*``,
    ``circ_successor*``), and the token list used (one row per token and task)."""
    n_layers, n_heads = hw.shape[:2]
    ids = W.copy_tokens(tokenizer, s.n_tokens, s.seed)
    logits = W.ov_logits(hw, ext_fn(ids), unembed[ids])
    copy, neg = W.copying(logits, s.top_k)
    cols = {"layer": np.repeat(np.arange(n_layers), n_heads), "head": np.tile(np.arange(n_heads), n_layers)}
    cols.update(_share_columns(copy, s.top_k / len(ids), "copying", s, 1))
    cols.update(_share_columns(neg, s.top_k / len(ids), "neg_copying", s, 2))
    tokens = [{"task": "copying", "id": int(i), "piece": t, "successor": ""}
              for i, t in zip(ids, tokenizer.convert_ids_to_tokens(ids.tolist()))]  # fmt: skip
    hits, chance = [], []
    for name, tids, succ in W.successor_items(tokenizer):
        tids, succ = np.asarray(tids), np.asarray(succ)
        lg = W.ov_logits(hw, ext_fn(tids), unembed[tids])
        hits.append(W.successor_hits(lg, succ))
        chance += [1.0 / len(tids)] * int((succ >= 0).sum())
        pieces = tokenizer.convert_ids_to_tokens(tids.tolist())
        tokens += [{"task": name, "id": int(t), "piece": p, "successor": pieces[j] if j >= 0 else ""}
                   for t, p, j in zip(tids, pieces, succ)]  # fmt: skip
    if hits:
        cols.update(_share_columns(np.concatenate(hits, 1), float(np.mean(chance)), "successor", s, 3))
    return pd.DataFrame(cols), pd.DataFrame(tokens)


def weights_tables(model, lm_model, reason: str | None, tokenizer, name: str, settings: CircuitSettings) -> dict:
    """Every table of rule circuits_weights: ``pairs``, ``summary``, ``heads`` (per head, with ``circ_note``),
    ``tokens``. ``lm_model`` is the model with its LM head (None, with ``reason``, when it has none)."""
    n_layers, n_heads = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    heads = _grid(n_layers, n_heads, name)
    try:
        hw = W.head_weights(model)
    except W.UnsupportedModel as e:
        heads["circ_note"] = f"weights: skipped: {e}"
        return {"pairs": pd.DataFrame(), "summary": pd.DataFrame([{"model": name, "status": f"skipped: {e}"}]),
                "heads": heads, "tokens": pd.DataFrame(), "comp": None, "hw": None}  # fmt: skip
    c = settings.composition
    comp = W.composition(hw, c.max_layer_gap, c.memory_gb)
    pairs, summary = composition_tables(comp, name, n_layers, n_heads, hw.d_eff, settings)
    heads = heads.merge(composition_head_columns(comp, n_layers, n_heads), on=KEY)
    note, tokens = "", pd.DataFrame()
    gap = "" if c.max_layer_gap is None else f"composition: pairs at most {c.max_layer_gap} layers apart"
    if lm_model is None:
        note = f"copying/successor: skipped: {reason}"
    else:
        try:
            ov, tokens = ov_head_columns(hw, lambda ids: W.extended_embedding(model, ids), W.unembedding(lm_model),
                                         tokenizer, settings)  # fmt: skip
            heads = heads.merge(ov, on=KEY)
        except W.UnsupportedModel as e:
            note = f"copying/successor: skipped: {e}"
    heads["circ_note"] = "; ".join(x for x in (gap, note) if x)
    return {"pairs": pairs, "summary": summary, "heads": heads, "tokens": tokens, "comp": comp, "hw": hw}


def composition_from_pairs(pairs: pd.DataFrame, n_layers: int, n_heads: int) -> dict | None:
    """The z arrays of :func:`headatlas.circuits.weights.composition` rebuilt from a composition.tsv (its pairs, the
    scored ones; -inf elsewhere) with ``causal`` and ``scored`` (the pairs of the table)."""
    if pairs is None or not len(pairs):
        return None
    n = n_layers * n_heads
    z = np.full((len(W.MODES), n, n), -np.inf)
    wi = pairs["writer_layer"].to_numpy() * n_heads + pairs["writer_head"].to_numpy()
    ri = pairs["reader_layer"].to_numpy() * n_heads + pairs["reader_head"].to_numpy()
    for mi, mode in enumerate(W.MODES):
        z[mi, wi, ri] = pairs[f"comp_{mode}_z"].to_numpy()
    layer = np.repeat(np.arange(n_layers), n_heads)
    scored = np.zeros((n, n), bool)
    scored[wi, ri] = True
    return {"z": z, "causal": layer[:, None] < layer[None, :], "scored": scored}


# --- long inputs ----------------------------------------------------------------------------------------------


def long_tables(runs: list[dict], scores: np.ndarray, long_range: dict, short_induction: np.ndarray | None,
                model: str, n_layers: int, n_heads: int, settings: CircuitSettings) -> dict:  # fmt: skip
    """``runs`` (one row per needle run), ``heads`` (``circ_retrieval*``, ``circ_echo_long*``,
    ``circ_induction_long*``, the RazorAttention sets), ``bins`` (share of heads per Wu bin, beside Wu et al.)."""
    s = settings
    n = n_layers * n_heads
    heads = pd.DataFrame({"layer": np.arange(n) // n_heads, "head": np.arange(n) % n_heads})
    runs_df = pd.DataFrame(runs)
    if len(runs_df):
        runs_df.insert(0, "model", model)
    answered = runs_df["answered"].to_numpy(bool) if len(runs_df) else np.zeros(0, bool)
    k = int(answered.sum())
    flat = scores.reshape(len(scores), -1) if len(scores) else np.zeros((0, n))
    if k:
        sc = flat[answered]
        lo, hi = bootstrap_ci(sc, n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, 31]))
        heads["circ_retrieval"], heads["circ_retrieval_ci_low"], heads["circ_retrieval_ci_high"] = sc.mean(0), lo, hi
        heads["circ_retrieval_positive"] = lo > 0
    else:
        for c in ("circ_retrieval", "circ_retrieval_ci_low", "circ_retrieval_ci_high"):
            heads[c] = np.nan
        heads["circ_retrieval_positive"] = False
    heads["circ_retrieval_runs"] = k
    note = "" if k else f"retrieval: no answered needle run of {len(runs_df)} (ROUGE-1 recall > threshold): no score"
    bins = retrieval_bins(heads["circ_retrieval"].to_numpy(float))
    bins_df = pd.DataFrame([{"model": model, "source": "headatlas", "answered_runs": k, "runs": len(runs_df),
                             **dict(zip(BIN_NAMES, bins))},
                            {"model": "Llama-2-7B-80K", "source": "Wu et al. 2024 (pie chart)", "answered_runs": np.nan,
                             "runs": np.nan, **dict(zip(BIN_NAMES, (0.702, 0.265, 0.026, 0.006)))}])  # fmt: skip
    sets = []
    for m, res in long_range.items():
        suffix = "" if m == min(long_range) else f"_{m}"
        for what in ("echo", "induction"):
            x = res[what].reshape(len(res[what]), -1)
            ok = ~np.isnan(x).any(1)
            lo, hi = bootstrap_ci(x[ok], n_boot=s.bootstrap, level=s.ci, rng=np.random.default_rng([s.seed, 32, m]))
            col = f"circ_{what}_long{suffix}"
            heads[col], heads[f"{col}_ci_low"], heads[f"{col}_ci_high"] = x[ok].mean(0), lo, hi
        heads[f"circ_echo_top1{suffix}"] = top_share(heads[f"circ_echo_long{suffix}"].to_numpy(float), 0.01)
        heads[f"circ_induction_top14{suffix}"] = top_share(heads[f"circ_induction_long{suffix}"].to_numpy(float), 0.14)
        row = {
            "model": model,
            "block_length": m,
            "echo_top1": int(heads[f"circ_echo_top1{suffix}"].sum()),
            "induction_top14": int(heads[f"circ_induction_top14{suffix}"].sum()),
        }
        if short_induction is not None:
            short = top_share(short_induction, 0.14)
            both = int((short & heads[f"circ_induction_top14{suffix}"]).sum())
            row.update({"short_induction_top14": int(short.sum()), "overlap": both,
                        "jaccard": both / int((short | heads[f"circ_induction_top14{suffix}"]).sum()),
                        "overlap_chance": short.sum() ** 2 / n})  # fmt: skip
        sets.append(row)
    return {"runs": runs_df, "heads": heads, "bins": bins_df, "sets": pd.DataFrame(sets), "note": note}


WINDOW_COLUMNS = ["model", "status", "reason", "run", "length", "depth", "needle_start", "needle_end", "distance",
                  "window", "beyond_window", "answered", "sliding_layers", "global_layers", "sliding_heads",
                  "max_sliding", "max_global", "ok"]  # fmt: skip


def window_check(runs: pd.DataFrame, scores: np.ndarray, windows: np.ndarray, model: str) -> pd.DataFrame:
    """The structural check of a model with sliding-window layers (``windows`` [L], 0 = global: ``longrange.
    layer_windows``). A head of a layer with a window of w keys sees key j from the query at q only when q - j < w.
    The first answer token's query sits at the prompt's last position (``length`` - 1) and later ones further on,
    so when the needle's last token lies ``distance`` = length - needle_end >= w positions before it, no head of
    that layer can attend to the needle at any step: its score in that run must be 0. One row per needle run and
    window: the distance, whether the needle lies beyond the window, the largest run score of the window's heads
    (``max_sliding``) and of the global layers' heads (``max_global``), and ``ok`` (beyond the window: exactly 0).
    Layers are 1-based in the text columns. A model without sliding-window layers gets one skipped row."""
    windows = np.asarray(windows, dtype=int)
    if not (windows > 0).any() or not len(runs):
        reason = "no sliding-window layers" if not (windows > 0).any() else "no needle runs"
        return pd.DataFrame([{"model": model, "status": "skipped", "reason": reason}], columns=WINDOW_COLUMNS)
    layers = lambda mask: " ".join(str(i + 1) for i in np.flatnonzero(mask))  # noqa: E731
    glob = windows == 0
    rows = []
    for r, run in enumerate(runs.to_dict("records")):
        dist = int(run["length"]) - int(run["needle_end"])
        for w in np.unique(windows[windows > 0]):
            sliding = scores[r][windows == w]
            beyond = dist >= w
            top = float(sliding.max())
            rows.append({"model": model, "status": "ok", "reason": "", "run": run["run"], "length": run["length"],
                         "depth": run["depth"], "needle_start": run["needle_start"], "needle_end": run["needle_end"],
                         "distance": dist, "window": int(w), "beyond_window": bool(beyond),
                         "answered": bool(run["answered"]), "sliding_layers": layers(windows == w),
                         "global_layers": layers(glob), "sliding_heads": int(sliding.size), "max_sliding": top,
                         "max_global": float(scores[r][glob].max()) if glob.any() else np.nan,
                         "ok": bool(top == 0) if beyond else True})  # fmt: skip
    return pd.DataFrame(rows, columns=WINDOW_COLUMNS)


def assert_windows(table: pd.DataFrame) -> None:
    """An error naming the runs where a sliding-window head scored for a needle beyond its window (the decoding
    read a key the layer cannot see: the retrieval scores would be wrong)."""
    bad = table[table["status"].eq("ok") & ~table["ok"].astype(bool)] if len(table) else table
    if len(bad):
        runs = ", ".join(f"run {r.run} (needle {r.distance} tokens back, window {r.window}, score {r.max_sliding:.3g})"
                         for r in bad.itertuples())  # fmt: skip
        raise RuntimeError(f"model {table['model'].iloc[0]}: sliding-window heads scored beyond their window: {runs}")


# --- the join and the agreement ---------------------------------------------------------------------------------


AGREEMENT_COLUMNS = ["model", "score_a", "score_b", "status", "n_heads", "spearman", "ci_low", "ci_high", "p", "top_k",
                     "top_k_overlap", "top_k_jaccard", "top_k_chance"]  # fmt: skip


def agreement(heads: pd.DataFrame, detectors: pd.DataFrame | None, ablation: pd.DataFrame | None, model: str,
              settings: CircuitSettings) -> pd.DataFrame:  # fmt: skip
    """Spearman (bootstrap CI over heads) and top-k overlap between every pair of: retrieval, echo and induction at
    long range, short-range induction and sink (detectors), the ablation effect (``ablation_<task>_loss``: ablated -
    intact loss of each head, exact or checked estimate; NaN heads left out). ``detectors`` / ``ablation`` are None
    when that analysis does not cover the model; a score that is absent gets one row with ``status`` saying why
    ("not run: ..." / "skipped: ..."; its numbers NaN) instead of leaving the table silent."""
    s = settings
    cols, missing = {}, {}
    notes = {p for n in heads.get("circ_note", pd.Series(dtype=str)).dropna().astype(str) for p in n.split("; ")}
    for name, col in (("retrieval", "circ_retrieval"), ("echo_long", "circ_echo_long"),
                      ("induction_long", "circ_induction_long")):  # fmt: skip
        if col in heads and heads[col].notna().any():
            cols[name] = heads[col].to_numpy(float)
        else:
            why = sorted(p for p in notes if p.startswith(("long inputs", "retrieval")))
            missing[name] = "skipped: " + ("; ".join(why) or ("no score" if col in heads else "long inputs not run"))
    base = heads[KEY]
    if detectors is None:
        for name in ("induction_short", "sink"):
            missing[name] = "not run: analysis.detectors does not cover the model"
    else:
        main = detectors[flags(detectors["main"])]
        for det, name in (("induction", "induction_short"), ("sink", "sink")):
            d = main[main["detector"] == det][KEY + ["mean"]]
            cols[name] = base.merge(d, on=KEY, how="left")["mean"].to_numpy(float)
    if ablation is None:
        missing["ablation"] = "not run: analysis.ablation does not cover the model"
    else:
        ok = ablation[(ablation["status"] == "ok") & (ablation["metric"] == "loss")] if len(ablation) else ablation
        for task, a in ok.groupby("task", sort=False) if len(ok) else ():
            if a["effect"].notna().any():
                cols[f"ablation_{task}_loss"] = base.merge(a[KEY + ["effect"]], on=KEY, how="left")["effect"].to_numpy(
                    float
                )
        if not any(n.startswith("ablation_") for n in cols):
            reasons = ablation["reason"].dropna().astype(str).unique() if "reason" in ablation else []
            missing["ablation"] = "skipped: " + ("; ".join(r for r in reasons if r) or "no head effect")
    names = list(cols)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            rho, lo, hi, p, n = spearman_ci(cols[a], cols[b], s.bootstrap, s.seed)
            both, jac, chance = topk_overlap(cols[a], cols[b], s.agreement_top_k)
            rows.append({"model": model, "score_a": a, "score_b": b, "status": "ok", "n_heads": n, "spearman": rho,
                         "ci_low": lo, "ci_high": hi, "p": p, "top_k": s.agreement_top_k, "top_k_overlap": both,
                         "top_k_jaccard": jac, "top_k_chance": chance})  # fmt: skip
    rows += [{"model": model, "score_a": name, "score_b": "", "status": why} for name, why in missing.items()]
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def join_heads(weights: pd.DataFrame, long: pd.DataFrame | None, induction: pd.DataFrame | None,
               induction_summary: pd.DataFrame | None, notes: list[str]) -> pd.DataFrame:  # fmt: skip
    """The per-head table the atlas reads: weights columns, long-input columns, the induction check's drop of each
    induction head and whether a head was among the ablated previous-token heads; ``circ_note`` joins the skips."""
    out = weights.copy()
    if long is not None and len(long):
        out = out.merge(long, on=KEY, how="left")
    if induction is not None and len(induction):
        d = induction[KEY + ["drop", "drop_ci_low", "drop_ci_high"]].rename(
            columns={"drop": "circ_induction_drop", "drop_ci_low": "circ_induction_drop_ci_low",
                     "drop_ci_high": "circ_induction_drop_ci_high"})  # fmt: skip
        out = out.merge(d, on=KEY, how="left")
    if induction_summary is not None and len(induction_summary) and "prev_heads" in induction_summary:
        ablated = set(str(induction_summary["prev_heads"].iloc[0]).split())
        out["circ_prev_ablated"] = out["label"].isin(ablated)
    extra = "; ".join(n for n in notes if n)
    note = out.get("circ_note", pd.Series([""] * len(out))).fillna("").astype(str)
    out["circ_note"] = [("; ".join(x for x in (a, extra) if x)) for a in note]
    return out


def read_table(path) -> pd.DataFrame:
    """A TSV of this analysis; an empty file (a skipped table) is an empty frame."""
    try:
        return pd.read_csv(path, sep="\t")
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def long_skipped(model: str, n_layers: int, n_heads: int, reason: str) -> dict:
    """The long-input tables of a model that cannot decode (an encoder): the reason instead of scores."""
    n = n_layers * n_heads
    heads = pd.DataFrame({"layer": np.arange(n) // n_heads, "head": np.arange(n) % n_heads})
    row = {"model": model, "status": "skipped", "reason": reason}
    return {"runs": pd.DataFrame([row]), "heads": heads, "bins": pd.DataFrame([row]), "sets": pd.DataFrame([row]),
            "window": pd.DataFrame([row], columns=WINDOW_COLUMNS), "note": f"long inputs: skipped: {reason}"}  # fmt: skip


def model_kind_only(spec, cache_dir) -> tuple[str, object]:
    """(kind, config) of a model from its config alone (no weights loaded: an encoder's skipped rules stay cheap)."""
    from transformers import AutoConfig

    loc, kwargs = resolve(spec, cache_dir)
    config = AutoConfig.from_pretrained(loc, **kwargs)
    return model_kind(config, spec), config


def _main_means(detectors: pd.DataFrame, detector: str, n_layers: int, n_heads: int) -> np.ndarray:
    """[L, H] the detectors' mean score of ``detector`` on its main input (NaN where absent)."""
    out = np.full((n_layers, n_heads), np.nan)
    d = detectors[flags(detectors["main"]) & (detectors["detector"] == detector)]
    out[d["layer"].to_numpy(int), d["head"].to_numpy(int)] = d["mean"].to_numpy(float)
    return out


def induction_check(spec, model, tokenizer, config, detectors: pd.DataFrame, pairs: pd.DataFrame, det_settings,
                    settings) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """The causal check of one loaded causal model (:mod:`headatlas.circuits.induction`) on the first
    ``settings.n_sequences`` of the detectors' repeated random sequences (``det_settings``: their DetectorSettings):
    (summary, per induction head)."""
    bos = decoder_bos(tokenizer, config, spec)
    seqs, kinds = random_inputs(tokenizer, "decoder", bos, det_settings, spec.max_length, 0, spec.name)
    repeated = [t for t, k in zip(seqs, kinds) if k == "repeated"][: settings.n_sequences]
    pad = pad_token(tokenizer)
    result = ablation_check(model, repeated, "decoder", pad, spec.name, detectors, settings, det_settings.batch_size)
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    comp = composition_from_pairs(pairs, n_layers, n_heads)
    prev = _main_means(detectors, "prev", n_layers, n_heads)
    return ablation_tables(result, spec.name, settings, comp, prev, n_heads)


def long_inputs(spec, lm_model, model, tokenizer, config, haystack: str, long, detectors: pd.DataFrame | None,
                settings: CircuitSettings, log=None) -> dict:  # fmt: skip
    """The long-input tables of one causal model (:func:`long_tables`): needle runs on ``haystack`` (text), the
    long-range echo / induction scores, their overlap with the detectors' short-range induction heads."""
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    positions = int(getattr(config, "max_position_embeddings", 0) or spec.max_length)
    long, too_long = fitting_lengths(long, positions)
    bos = decoder_bos(tokenizer, config, spec)
    hay = np.asarray(tokenizer(haystack, add_special_tokens=False)["input_ids"])
    items = needle_inputs(tokenizer, hay, long, bos, positions, chat_frame(tokenizer) if long.chat else None)
    runs = retrieval_runs(lm_model, tokenizer, items, long, log)
    window = window_check(pd.DataFrame(runs["runs"]), runs["scores"], layer_windows(config), spec.name)
    assert_windows(window)  # before the repeated blocks: a failed check fails the rule early
    pad = pad_token(tokenizer)
    lr = long_range_scores(model, tokenizer, "decoder", bos, long, pad, spec.name)
    short = None if detectors is None else _main_means(detectors, "induction", n_layers, n_heads).ravel()
    out = long_tables(runs["runs"], runs["scores"], lr, short, spec.name, n_layers, n_heads, settings)
    out["window"] = window
    if too_long:
        if log is not None:
            log.warning("model %s: %s", spec.name, too_long)
        out["note"] = "; ".join(x for x in (too_long, out["note"]) if x)
    return out


def fitting_lengths(long, positions: int):
    """``long`` without the needle lengths (plus the answer's tokens) and repeated-block lengths (two blocks and
    the frame's BOS) that exceed the model's ``positions``, and a note naming what was left out ("" if nothing)."""
    from dataclasses import replace

    lengths = tuple(n for n in long.lengths if n + long.max_new_tokens <= positions)
    blocks = tuple(m for m in long.block_lengths if 2 * m + 1 <= positions)
    dropped = [f"needle lengths {sorted(set(long.lengths) - set(lengths))}"] if lengths != long.lengths else []
    if blocks != long.block_lengths:
        dropped.append(f"block lengths {sorted(set(long.block_lengths) - set(blocks))}")
    note = f"long inputs: {' and '.join(dropped)} skipped: the model has {positions} positions" if dropped else ""
    return replace(long, lengths=lengths, block_lengths=blocks), note


def skipped(model: str, reason: str) -> pd.DataFrame:
    """A one-row table saying why a part did not run."""
    return pd.DataFrame([{"model": model, "status": "skipped", "reason": reason}])
