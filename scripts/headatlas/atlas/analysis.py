"""The head atlas: every analysis joined per head, agreement between the papers' methods,
and cross-model comparison on relative depth.

Inputs are the tidy per-head tables the analyses write (every one has model, layer, head
columns, 0-based). Any of them may be missing when its analysis is not configured; the
atlas then simply lacks those columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.agreement import spearman_ci, topk_overlap
from ..core.figures import head_label
from ..core.io import flags, head_shape
from ..core.settings import Settings
from ..detectors.registry import REGISTRY as DETECTORS

KEY = ["layer", "head"]
# Pande's main roles in their order (the markers of the atlas grid, the cross-model panels): the registry's
# pande.roles.main_roles(), copied because the atlas imports no paper package; tests/unit/pande/test_roles.py checks it
PANDE_ROLES_MAIN = ["local", "syntactic", "delimiter", "block"]
# Jo & Myaeng's categories (syntactic_semantic_head_distribution.ipynb): surface is a sum there; we use means.
JM_CATEGORIES = {
    "surface": ["SentLen", "WordContent"],
    "syntactic": ["TreeDepth", "TopConstituents", "BigramShift"],
    "semantic": ["Tense", "SubjNumber", "ObjNumber", "OddManOut", "CoordinationInversion"],
}
SURFACE_COLUMNS = ["next", "prev", "self", "cls", "sep", "punct", "entropy", "cls_entropy"]


def grid(n_layers: int, n_heads: int) -> pd.DataFrame:
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({"layer": layer, "head": head, "label": [head_label(a, b) for a, b in zip(layer, head)]})


def _check_heads(df: pd.DataFrame, name: str, n_layers: int, n_heads: int) -> None:
    bad = (df["layer"] >= n_layers) | (df["head"] >= n_heads) | (df["layer"] < 0) | (df["head"] < 0)
    if bad.any():
        raise ValueError(
            f"{name}: heads outside the {n_layers} x {n_heads} grid, e.g. {df.loc[bad, KEY].iloc[0].tolist()}"
        )


def surface_columns(behaviour: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in SURFACE_COLUMNS if c in behaviour.columns]
    out = behaviour[KEY + ["label"] + cols].rename(columns={"label": "behaviour", **{c: f"clark_{c}" for c in cols}})
    return out.rename(columns={"behaviour": "clark_behaviour"})


def mds_columns(mds: pd.DataFrame) -> pd.DataFrame:
    return mds[KEY + ["mds_x", "mds_y"]].rename(columns={"mds_x": "clark_mds_x", "mds_y": "clark_mds_y"})


PANDE_STABILITY = ["stability_faithful", "stability_fdr", "corpus_share_faithful", "corpus_share_fdr"]
# the effect's CI (pande/heads.tsv effect_ci_low/high) -> pande_{role}_effect_ci_low/high: a column's CI is
# <column>_ci_low / <column>_ci_high beside it (the atlas page shows it with the value)
PANDE_EFFECT_CI = ["effect_ci_low", "effect_ci_high"]


def pande_columns(pande: pd.DataFrame) -> pd.DataFrame:
    """Per role: effect size (mean score / tau), significance in both modes and, when the table
    has them, the stability of each label (share of bootstrap resamples, of corpora) and the
    effect's 95% CI."""
    wide = pande.pivot_table(
        index=KEY, columns="role", values=["effect", "significant_faithful", "significant_fdr"], aggfunc="first"
    )
    wide.columns = [
        f"pande_{role}_{'effect' if v == 'effect' else v.replace('significant_', 'sig_')}" for v, role in wide.columns
    ]
    wide = wide.reset_index()
    for c in wide.columns:
        if "_sig_" in c:
            wide[c] = flags(wide[c])
    stab = [c for c in PANDE_STABILITY + PANDE_EFFECT_CI if c in pande]
    if stab:  # after the columns above, so that those keep their place; NA where a role has no test
        roles = list(dict.fromkeys(pande["role"]))
        extra = pande.pivot_table(index=KEY, columns="role", values=stab, aggfunc="first", dropna=False)
        extra = extra.reindex(columns=pd.MultiIndex.from_product([stab, roles]))
        extra.columns = [f"pande_{role}_{v}" for v, role in extra.columns]
        wide = wide.merge(extra.reset_index(), on=KEY, how="left")
    return wide


def syntax_columns(heads: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """The relation each head predicts best (largest margin over that relation's best
    fixed-offset baseline), its accuracy and margin, and its accuracy on 'All'."""
    best_dir = heads.sort_values("accuracy", ascending=False).drop_duplicates(KEY + ["relation"])
    base = baselines.groupby("relation")["accuracy"].max().rename("baseline")
    best_dir = best_dir.join(base, on="relation")
    best_dir["margin"] = best_dir["accuracy"] - best_dir["baseline"]
    rel = best_dir[best_dir["relation"] != "All"].sort_values("margin", ascending=False).drop_duplicates(KEY)
    out = rel[KEY + ["relation", "direction", "accuracy", "margin"]].rename(
        columns={
            "relation": "syntax_best_relation",
            "direction": "syntax_best_direction",
            "accuracy": "syntax_best_accuracy",
            "margin": "syntax_best_margin",
        }
    )
    all_ = best_dir[best_dir["relation"] == "All"][KEY + ["accuracy", "margin"]].rename(
        columns={"accuracy": "syntax_all_accuracy", "margin": "syntax_all_margin"}
    )
    return out.merge(all_, on=KEY, how="outer")


def relation_accuracy(heads: pd.DataFrame, relation: str) -> pd.DataFrame:
    """Per head, the better direction's accuracy on one relation."""
    r = heads[heads["relation"] == relation]
    return r.groupby(KEY)["accuracy"].max().reset_index()


def coref_columns(coref: pd.DataFrame) -> pd.DataFrame:
    c = coref[(coref["split"] == "all")]
    wide = c.pivot_table(index=KEY, columns="type", values="accuracy", aggfunc="first")
    wide.columns = [f"coref_{t}_accuracy" if t != "all" else "coref_accuracy" for t in wide.columns]
    return wide.reset_index()


def probe_columns(probes: pd.DataFrame) -> pd.DataFrame:
    """Per task the probe's test score, ``probe_{task}_acc`` (accuracy) or, for a relatedness task
    scored by Pearson r (metric ``pearson``, SICK-R), ``probe_{task}_r``; its selectivity; and the
    mean accuracy per Jo & Myaeng category."""
    wide = probes.pivot_table(index=KEY, columns="task", values=["test_acc", "selectivity"], aggfunc="first")
    pearson = set(probes.loc[probes["metric"] == "pearson", "task"]) if "metric" in probes else set()
    score = {t: "r" if t in pearson else "acc" for t in probes["task"]}
    wide.columns = [f"probe_{task}_{score[task] if v == 'test_acc' else 'selectivity'}" for v, task in wide.columns]
    wide = wide.reset_index()
    for cat, tasks in JM_CATEGORIES.items():
        cols = [f"probe_{t}_acc" for t in tasks if f"probe_{t}_acc" in wide.columns]
        if cols:
            wide[f"probe_{cat}_mean_acc"] = wide[cols].mean(axis=1)
    return wide


def detector_columns(heads: pd.DataFrame) -> pd.DataFrame:
    """Per detector, on the input kind its table marks ``main``: the mean score with its CI and the significance
    against the shuffled-position null (FDR); the sink flag (mean attention to the first token above epsilon)
    and the key/value group of the head."""
    main = heads[flags(heads["main"])]
    wide = main.pivot_table(
        index=KEY, columns="detector", values=["mean", "ci_low", "ci_high", "significant"], aggfunc="first"
    )
    names = {"mean": "", "ci_low": "_ci_low", "ci_high": "_ci_high", "significant": "_sig"}
    detectors = list(dict.fromkeys(main["detector"]))
    wide = wide.reindex(columns=pd.MultiIndex.from_product([list(names), detectors]))
    wide.columns = [f"det_{d}{names[v]}" for v, d in wide.columns]
    wide = wide[[f"det_{d}{names[v]}" for d in detectors for v in names]].reset_index()
    for c in wide.columns:
        if c.endswith("_sig"):
            wide[c] = flags(wide[c])
    sink = main[main["detector"] == "sink"][KEY + ["above_threshold"]].rename(
        columns={"above_threshold": "det_sink_head"}
    )
    sink["det_sink_head"] = flags(sink["det_sink_head"])
    group = main.drop_duplicates(KEY)[KEY + ["kv_group"]].rename(columns={"kv_group": "det_kv_group"})
    return wide.merge(sink, on=KEY, how="left").merge(group, on=KEY, how="left")


def ablation_columns(ablation: pd.DataFrame) -> pd.DataFrame:
    """Per task and metric: the ablation effect (ablated - intact; loss in nats, accuracy a share)
    with its CI, how it was measured (``_method``: ``exact``, the estimator, ``none`` or
    ``skipped: <reason>``) and what the value is (``_effect_kind``: ``exact``, ``estimated
    (checked)``, ``unreliable`` or ``skipped: <reason>``; only exact and checked values have an
    effect)."""
    a = ablation.copy()
    skipped = a["status"] == "skipped"
    a["method"] = np.where(skipped, "skipped: " + a["reason"].fillna("").astype(str), a["method"])
    if "kind" not in a:  # a heads table written before the kinds
        a["kind"] = np.where(skipped, a["method"], np.where(a["method"] == "exact", "exact", "unreliable"))
    a["kind"] = np.where(skipped, a["method"], a["kind"])
    a["effect_kind"] = a["kind"]
    shown = a["effect_kind"].isin(["exact", "estimated (checked)"])
    for c in ("effect", "ci_low", "ci_high"):
        a[c] = a[c].where(shown)
    a["col"] = "ablation_" + a["task"] + "_" + a["metric"]
    names = ("effect", "ci_low", "ci_high", "method", "effect_kind")
    wide = a.pivot_table(index=KEY, columns="col", values=list(names), aggfunc="first", dropna=False)
    order = [(v, c) for c in dict.fromkeys(a["col"]) for v in names]
    wide = wide.reindex(columns=pd.MultiIndex.from_tuples(order))
    wide.columns = [f"{c}_{v}" for v, c in wide.columns]
    return wide.reset_index()


def circuit_columns(circuits: pd.DataFrame) -> pd.DataFrame:
    """The circuits table's ``circ_*`` columns as they are (composition z, copying, successor, retrieval, echo,
    long-range induction, the induction check; docs/circuits.md), without its per-test p-values and chance levels."""
    cols = [c for c in circuits.columns if c.startswith("circ_") and not c.endswith(("_p", "_chance"))]
    return circuits[KEY + cols]


def quiet_columns(quiet: pd.DataFrame) -> pd.DataFrame:
    """The quiet-heads table's ``quiet_*`` columns as they are (docs/quiet_heads.md)."""
    return quiet[KEY + [c for c in quiet.columns if c.startswith("quiet_")]]


def icl_columns(heads: pd.DataFrame) -> pd.DataFrame:
    """The atlas's ``icl_*`` columns from ``fv_heads.tsv`` (docs/icl.md): the AIE with its CI and kind (only exact
    and checked values are given; an unreliable or skipped head keeps its kind), the null quantile, above_null, top."""
    shown = heads["kind"].isin(["exact", "estimated (checked)"])
    out = heads[["layer", "head"]].copy()
    for src, dst in (("aie", "icl_aie"), ("ci_low", "icl_aie_ci_low"), ("ci_high", "icl_aie_ci_high"),
                     ("null_quantile", "icl_null_quantile")):  # fmt: skip
        out[dst] = heads[src].where(shown)
    out["icl_aie_kind"] = heads["kind"]
    for c in ("above_null", "top"):
        out[f"icl_{c}"] = heads[c].where(shown)
    return out


@dataclass(frozen=True)
class AtlasSource:
    """What one analysis adds to the atlas: which TSVs, which columns, how they are joined.

    ``tables`` maps the atlas rule's input names to path templates ({model}; {corpus} is the
    atlas setting named by ``corpus``). The source is read for the models its ``analysis``
    covers (and, when that analysis has a ``corpora`` list, only if the model has one of
    them, or the named corpus). ``columns`` takes the tables in ``tables`` order and returns
    one row per head (layer, head, then the new columns), left-joined on the head grid.
    """

    name: str
    analysis: str
    tables: dict[str, str]
    columns: Callable[..., pd.DataFrame]
    corpus: str | None = None


# The registry the atlas rule and build_atlas read; its order is the atlas's column order.
ATLAS_SOURCES = (
    AtlasSource(
        "behaviour",
        "clark_surface",
        {"behaviour": "results/clark/{model}/{corpus}/behaviour.tsv"},
        surface_columns,
        "surface_corpus",
    ),
    AtlasSource(
        "mds", "clark_surface", {"mds": "results/clark/{model}/{corpus}/mds.tsv"}, mds_columns, "surface_corpus"
    ),
    AtlasSource("pande", "pande", {"pande": "results/pande/{model}/heads.tsv"}, pande_columns),
    AtlasSource(
        "syntax",
        "clark_syntax",
        {
            "syntax": "results/clark/{model}/syntax/heads.tsv",
            "syntax_baselines": "results/clark/{model}/syntax/baselines.tsv",
        },
        syntax_columns,
    ),  # fmt: skip
    AtlasSource("coref", "clark_syntax", {"coref": "results/clark/{model}/coref/heads.tsv"}, coref_columns),
    AtlasSource("probes", "jomyaeng", {"probes": "results/jomyaeng/{model}/heads.tsv"}, probe_columns),
    AtlasSource("detectors", "detectors", {"detectors": "results/detectors/{model}/heads.tsv"}, detector_columns),
    AtlasSource("ablation", "ablation", {"ablation": "results/ablation/{model}/heads.tsv"}, ablation_columns),
    AtlasSource("circuits", "circuits", {"circuits": "results/circuits/{model}/heads.tsv"}, circuit_columns),
    AtlasSource("icl", "icl", {"fv_heads": "results/icl/{model}/fv_heads.tsv"}, icl_columns),
    AtlasSource("quiet", "quiet", {"quiet": "results/quiet/{model}/heads.tsv"}, quiet_columns),
)
TABLE_NAMES = [k for source in ATLAS_SOURCES for k in source.tables]


def source_inputs(
    source: AtlasSource, model: str, covered: bool, corpora: list[str] | None, settings: dict
) -> dict[str, str]:
    """The input paths of one source for one model ({} when the model has none): ``covered``
    says whether the analysis covers the model, ``corpora`` its corpora for the model (None:
    the analysis has no corpora list), ``settings`` the atlas section."""
    if not covered or (corpora is not None and not corpora):
        return {}
    corpus = settings[source.corpus] if source.corpus else None
    if corpus is not None and corpus not in (corpora or []):
        return {}
    return {k: t.format(model=model, corpus=corpus) for k, t in source.tables.items()}


def build_atlas(model: str, n_layers: int, n_heads: int, tables: dict[str, pd.DataFrame | None]) -> pd.DataFrame:
    """One row per head of ``model`` with the columns of every source whose tables are all given."""
    atlas = grid(n_layers, n_heads)
    for source in ATLAS_SOURCES:
        frames = [tables.get(k) for k in source.tables]
        if any(f is None for f in frames):
            continue
        files = ", ".join(str(f.attrs.get("path", k)) for f, k in zip(frames, source.tables))
        try:
            df = source.columns(*frames)
        except KeyError as e:
            raise ValueError(f"{files}: missing column {e} (atlas source {source.name}); rebuild the table") from None
        _check_heads(df, source.name, n_layers, n_heads)
        covered = len(df[KEY].drop_duplicates())
        if covered < n_layers * n_heads:  # a cut table would become NaN columns
            raise ValueError(
                f"{files}: rows for {covered} of the {n_layers} x {n_heads} heads (atlas source {source.name}); "
                "the table is incomplete: delete it and rerun snakemake"
            )
        if df.duplicated(KEY).any():
            raise ValueError(f"{source.name}: more than one row per head")
        atlas = atlas.merge(df, on=KEY, how="left")
    atlas = atlas.copy()  # consolidated: an insert into the merged frame (200+ blocks) warns "highly fragmented"
    atlas.insert(0, "model", model)
    return atlas


# --- agreement between methods ------------------------------------------------------


def method_scores(atlas: pd.DataFrame, syntax: pd.DataFrame | None, relations: list[str]) -> pd.DataFrame:
    """Per-head scores of each method, aligned on the atlas rows.

    - clark_syntax: argmax accuracy on all dependents ('All', better direction);
    - pande_syntactic: sieve effect size (mean score / tau) of the pooled syntactic role;
    - jm_syntactic: mean probing test accuracy over TreeDepth, TopConstituents, BigramShift;
    and per relation r: clark_r (argmax accuracy) and pande_r (effect size of syntactic_r).
    """
    out = atlas[KEY].copy()
    if "syntax_all_accuracy" in atlas:
        out["clark_syntax"] = atlas["syntax_all_accuracy"].to_numpy()
    if "pande_syntactic_effect" in atlas:
        out["pande_syntactic"] = atlas["pande_syntactic_effect"].to_numpy()
    if "probe_syntactic_mean_acc" in atlas:
        out["jm_syntactic"] = atlas["probe_syntactic_mean_acc"].to_numpy()
    for r in relations:
        if syntax is not None and (syntax["relation"] == r).any():
            acc = relation_accuracy(syntax, r).rename(columns={"accuracy": f"clark_{r}"})
            out = out.merge(acc, on=KEY, how="left")
        if f"pande_syntactic_{r}_effect" in atlas:
            out[f"pande_{r}"] = atlas[f"pande_syntactic_{r}_effect"].to_numpy()
    return out


def agreement_table(scores: pd.DataFrame, model: str, k: int, n_boot: int, seed: int) -> pd.DataFrame:
    """Rank correlation (bootstrap CI) and top-k overlap for every pair of method scores that
    measure the same thing: the three syntactic scores, and Clark vs Pande per relation."""
    pairs = [
        (a, b)
        for i, a in enumerate(["clark_syntax", "pande_syntactic", "jm_syntactic"])
        for b in ["clark_syntax", "pande_syntactic", "jm_syntactic"][i + 1 :]
    ]
    pairs += [
        (c, "pande_" + c[len("clark_") :]) for c in scores.columns if c.startswith("clark_") and c != "clark_syntax"
    ]
    rows = []
    for a, b in pairs:
        if a not in scores or b not in scores:
            continue
        x, y = scores[a].to_numpy(float), scores[b].to_numpy(float)
        rho, lo, hi, p, n = spearman_ci(x, y, n_boot, seed)
        both, jac, chance = topk_overlap(x, y, k)
        rows.append({"model": model, "method_a": a, "method_b": b, "n_heads": n, "spearman": rho, "ci_low": lo, "ci_high": hi, "p": p,
                     "top_k": k, "top_k_overlap": both, "top_k_jaccard": jac, "top_k_chance": chance})  # fmt: skip
    return pd.DataFrame(
        rows,
        columns=[
            "model",
            "method_a",
            "method_b",
            "n_heads",
            "spearman",
            "ci_low",
            "ci_high",
            "p",
            "top_k",
            "top_k_overlap",
            "top_k_jaccard",
            "top_k_chance",
        ],
    )


def relation_heads_vs_sieve(
    atlas: pd.DataFrame, syntax: pd.DataFrame, relations: list[str], k: int, model: str
) -> pd.DataFrame:
    """Are the heads Clark's argmax finds for relation r the heads Pande's test calls syntactic?

    For each relation: Clark's best head, whether it is sieve-significant (FDR) for r and for
    the pooled syntactic role, and the share of Clark's top-k heads for r that are significant,
    against the share among all heads."""
    rows = []
    for r in relations:
        acc = relation_accuracy(syntax, r)
        sig_col = f"pande_syntactic_{r}_sig_fdr"
        if acc.empty or sig_col not in atlas:
            continue
        merged = atlas[KEY + [sig_col, "pande_syntactic_sig_fdr"]].merge(acc, on=KEY)
        top = merged.sort_values("accuracy", ascending=False, kind="stable").head(k)
        best = top.iloc[0]
        rows.append({
            "model": model, "relation": r, "clark_best_head": head_label(best["layer"], best["head"]), "clark_best_accuracy": best["accuracy"],
            "best_is_sieve_significant": bool(best[sig_col]), "best_is_syntactic_significant": bool(best["pande_syntactic_sig_fdr"]),
            "top_k": k, "top_k_share_significant": float(top[sig_col].mean()), "all_heads_share_significant": float(merged[sig_col].mean()),
        })  # fmt: skip
    return pd.DataFrame(rows)


# --- cross-model comparison ------------------------------------------------------------


def relative_depth(layer: np.ndarray, n_layers: int) -> np.ndarray:
    """Layer position on [0, 1]: the centre of layer l of L is (l + 0.5) / L."""
    return (np.asarray(layer) + 0.5) / n_layers


def layer_profiles(atlas: pd.DataFrame, n_layers: int) -> pd.DataFrame:
    """Per layer: share of heads with each Pande role (FDR), share of each Clark behaviour,
    and mean probing accuracy per Jo & Myaeng category; with relative depth."""
    g = atlas.groupby("layer")
    out = pd.DataFrame({"layer": np.arange(n_layers)})
    out["relative_depth"] = relative_depth(out["layer"], n_layers)
    for role in PANDE_ROLES_MAIN:
        col = f"pande_{role}_sig_fdr"
        if col in atlas:
            out[f"share_{role}"] = g[col].mean().reindex(out["layer"]).to_numpy()
    if "clark_behaviour" in atlas:
        for label in sorted(atlas["clark_behaviour"].dropna().unique()):
            out[f"share_behaviour_{label}"] = (
                g["clark_behaviour"]
                .apply(lambda s, lab=label: float((s == lab).mean()))
                .reindex(out["layer"])
                .to_numpy()
            )
    for cat in JM_CATEGORIES:
        col = f"probe_{cat}_mean_acc"
        if col in atlas:
            out[f"probe_{cat}"] = g[col].mean().reindex(out["layer"]).to_numpy()
    for name in DETECTORS:
        col = f"det_{name}_sig"
        if col in atlas:
            out[f"share_det_{name}"] = g[col].apply(_share).reindex(out["layer"]).to_numpy()
    if "circ_retrieval" in atlas and atlas["circ_retrieval"].notna().any():
        out["share_retrieval"] = g["circ_retrieval"].apply(_retrieval_share).reindex(out["layer"]).to_numpy()
    return out


RETRIEVAL_HEAD = 0.1  # Wu et al.'s retrieval head: retrieval score above 0.1


def _share(values: pd.Series) -> float:
    """The share of True among the non-missing flags (NaN when none)."""
    f = flags(values, na=None).dropna()
    return float(f.mean()) if len(f) else np.nan


def _retrieval_share(scores: pd.Series) -> float:
    s = scores.dropna()
    return float((s > RETRIEVAL_HEAD).mean()) if len(s) else np.nan


LADDER_COLUMNS = ["model", "n_layers", "n_heads", "heads"]


def ladder_table(atlases: dict[str, pd.DataFrame], agreements: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per model, in the order given (smallest first reads as a ladder): the share of heads each detector
    finds (significant), where the induction heads sit (their mean relative depth), the sink heads, Wu et al.'s
    retrieval heads (score > 0.1) and how many of them are induction heads, the function-vector heads (``icl_top``)
    that are induction heads, the positional heads, and Clark's against Pande's syntactic ranking (Spearman with
    its CI, from the atlas's agreement table). NaN where the model has no such column."""
    rows = []
    for model, a in atlases.items():
        n_layers, n_heads = head_shape(a)
        row = {"model": model, "n_layers": n_layers, "n_heads": n_heads, "heads": len(a)}
        for name in DETECTORS:
            col = f"det_{name}_sig"
            row[f"{name}_share"] = _share(a[col]) if col in a else np.nan
        ind = flags(a["det_induction_sig"]) if "det_induction_sig" in a else None
        depth = relative_depth(a["layer"].to_numpy(), n_layers)
        row["induction_heads"] = int(ind.sum()) if ind is not None else np.nan
        row["induction_depth"] = float(depth[ind].mean()) if ind is not None and ind.any() else np.nan
        row["sink_head_share"] = _share(a["det_sink_head"]) if "det_sink_head" in a else np.nan
        r = a["circ_retrieval"] if "circ_retrieval" in a else pd.Series(np.nan, index=a.index)
        scored = r.notna().to_numpy()
        retrieval = (r > RETRIEVAL_HEAD).to_numpy() & scored
        row["retrieval_scored"] = int(scored.sum())
        row["retrieval_share"] = float(retrieval[scored].mean()) if scored.any() else np.nan
        row["retrieval_heads"] = int(retrieval.sum()) if scored.any() else np.nan
        row["retrieval_induction"] = int((retrieval & ind).sum()) if scored.any() and ind is not None else np.nan
        fv = a["icl_top"] if "icl_top" in a else pd.Series(pd.NA, index=a.index, dtype=object)
        top, has_fv = flags(fv), fv.notna().any()
        row["fv_top_heads"] = int(top.sum()) if has_fv else np.nan
        row["fv_top_induction"] = int((top & ind).sum()) if has_fv and ind is not None else np.nan
        row["positional_share"] = _share(a["quiet_positional_head"]) if "quiet_positional_head" in a else np.nan
        ag = agreements.get(model)
        pick = None if ag is None else ag[(ag["method_a"] == "clark_syntax") & (ag["method_b"] == "pande_syntactic")]
        for k in ("spearman", "ci_low", "ci_high"):
            row[f"clark_pande_{k}"] = float(pick[k].iloc[0]) if pick is not None and len(pick) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


# --- the atlas rule ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AtlasSettings(Settings):
    """analysis.atlas (workflow/schemas/atlas.schema.yaml)."""

    SECTION = "analysis.atlas"

    surface_corpus: str = "wiki"
    relations: tuple[str, ...] = ("nsubj", "obj", "amod", "advmod")
    top_k: int = 0
    bootstrap: int = 1000
    seed: int = 0


def atlas_tables(
    model: str, n_layers: int, n_heads: int, tables: dict[str, pd.DataFrame | None], settings: AtlasSettings
) -> dict[str, pd.DataFrame]:
    """Every table of rule atlas: the atlas, method agreement, relation heads vs the sieve
    test, the layer profile, and the method scores behind the agreement figure."""
    atlas = build_atlas(model, n_layers, n_heads, tables)
    k = settings.top_k or n_heads
    relations = list(settings.relations)
    scores = method_scores(atlas, tables.get("syntax"), relations)
    agreement = agreement_table(scores, model, k, settings.bootstrap, settings.seed)
    syntax = tables.get("syntax")
    rel = relation_heads_vs_sieve(atlas, syntax, relations, k, model) if syntax is not None else pd.DataFrame()
    profile = layer_profiles(atlas, n_layers)
    profile.insert(0, "model", model)
    return {"atlas": atlas, "agreement": agreement, "relations": rel, "profile": profile, "scores": scores}
