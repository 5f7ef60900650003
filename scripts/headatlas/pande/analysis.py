"""The heads-hypothesis analysis end to end: score files, pooled tests, figures, fine-tuning.

The rule scripts call these functions; each reads and writes files (atomically) and leaves
the formulas to :mod:`headatlas.pande.sieves`, :mod:`headatlas.pande.hypothesis` and
:mod:`headatlas.pande.figures`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.finetune import read_metrics
from ..core.integrity import IntegrityError, check_file, check_values, rebuild
from ..core.io import atomic_path, compressed, head_shape, write_tsv
from . import figures as pf
from .hypothesis import HypothesisSettings, head_table, pooled_notes, scipy_t_pvalues, with_stability
from .sieves import blas_threads

log = logging.getLogger("headatlas.pande.analysis")

FLOAT_FORMAT = "%.10g"


def save_scores(path: str | Path, result: dict, meta: dict) -> None:
    """Write the output of ``score_store`` (tests/reference/sieves.py) as one HDF5 file."""
    import h5py

    text = h5py.string_dtype(encoding="utf-8")
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            scores = np.asarray(result["scores"])
            f.create_dataset(
                "scores", data=scores, **compressed(scores.shape, scores.dtype)
            )  # [N, layers, heads, roles]
            f.create_dataset("pair_counts", data=result["pair_counts"])  # [N, relations + union]
            f.create_dataset("is_pair", data=result["is_pair"])
            if "lengths" in result:  # tokens per sequence (the score-against-length figure)
                f.create_dataset("lengths", data=np.asarray(result["lengths"], dtype=np.int64))
            f.create_dataset("record_id", data=[str(r) for r in result["record_id"]], dtype=text)
            f.create_dataset("roles", data=list(result["roles"]), dtype=text)
            f.create_dataset("relations", data=list(result["relations"]), dtype=text)
            f.attrs["notes"] = json.dumps(result["notes"], sort_keys=True)
            f.attrs["meta"] = json.dumps(meta, sort_keys=True)


def load_scores(path: str | Path) -> dict:
    """A score file of rule pande_scores, checked (its seal, its shapes, no infinite score)."""
    import h5py

    check_file(path)
    try:
        with h5py.File(path, "r") as f:
            out = {k: f[k][()] for k in ("scores", "pair_counts", "is_pair")}
            out["lengths"] = f["lengths"][()] if "lengths" in f else None
            for k in ("record_id", "roles", "relations"):
                out[k] = [str(x) for x in f[k].asstr()[()]]
            out["notes"] = json.loads(f.attrs["notes"])
            out["meta"] = json.loads(f.attrs["meta"])
    except (OSError, KeyError, ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path}: cannot read the score file ({type(e).__name__}: {e}); {rebuild(path)}") from None
    shape = out["scores"].shape
    if len(shape) != 4 or shape[0] != len(out["record_id"]) or shape[3] != len(out["roles"]):
        raise IntegrityError(
            f"{path}: scores of shape {shape} for {len(out['record_id'])} records and {len(out['roles'])} roles; "
            f"{rebuild(path)}"
        )
    check_values(path, {"scores": out["scores"]})
    return out


def pooled_scores(paths: list[str | Path]) -> tuple[np.ndarray, list[str], list[dict], list[dict], list[int]]:
    """Concatenate the sentence scores of several corpora (same model, same roles)."""
    parts = [load_scores(p) for p in paths]
    if not parts:
        raise ValueError("no score file given")
    roles = parts[0]["roles"]
    shape = parts[0]["scores"].shape[1:]
    for p, path in zip(parts, paths):
        if p["roles"] != roles or p["scores"].shape[1:] != shape:
            raise ValueError(f"{path}: roles {p['roles']} / shape {p['scores'].shape[1:]} differ from {paths[0]}'s")
    scores = np.concatenate([p["scores"] for p in parts])
    return scores, roles, [p["notes"] for p in parts], [p["meta"] for p in parts], [len(p["scores"]) for p in parts]


def model_table(
    paths: list[str | Path], model: str, settings: HypothesisSettings, threads: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per head x role tables of one model from its per-corpus score files (BLAS on
    ``threads`` threads): the pooled test (the paper's, with the stability columns appended)
    and the same test on each corpus alone."""
    with blas_threads(threads):
        return _model_table(paths, model, settings)


def _model_table(
    paths: list[str | Path], model: str, settings: HypothesisSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    scores, roles, notes, metas, sizes = pooled_scores(paths)
    valid = ~np.isnan(scores[:, 0, 0, :])
    for meta, path in zip(metas, paths):
        if meta.get("model") != model:
            raise ValueError(f"{path}: scores of model {meta.get('model')!r}, expected {model!r}")
    names = [str(m["corpus"]) for m in metas]
    if len(set(names)) != len(names):
        raise ValueError(f"a corpus is given twice: {names} ({paths})")
    start = 0
    for meta, n in zip(metas, sizes):
        log.info("corpus %s (%s trees): %d sequences; sentences per role %s", meta["corpus"], meta.get("trees"), n,
                 dict(zip(roles, valid[start : start + n].sum(0).tolist())))  # fmt: skip
        start += n
    pooled_n = dict(zip(roles, valid.sum(0).tolist()))
    table = head_table(scores, roles, model, settings, pooled_notes(notes, roles, pooled_n))
    for role, note in table.drop_duplicates("role").set_index("role")["note"].items():
        if note and pooled_n.get(role, 0) == 0:
            log.warning("role %s: n = 0, no test (%s)", role, note)
    if settings.tau > 0:
        check = scipy_t_pvalues(scores.reshape(len(scores), -1), settings.tau, settings.ddof)
        ours = table["p"].to_numpy()
        both = np.isfinite(check) & np.isfinite(ours)
        diff = float(np.abs(check[both] - ours[both]).max()) if both.any() else 0.0
        log.info(
            "faithful p-values against scipy.stats.ttest_1samp (ddof-adjusted): max |diff| = %.3g over %d tests",
            diff,
            int(both.sum()),
        )
        if diff > 1e-10:
            raise AssertionError(f"faithful p-values differ from scipy by {diff:.3g} (> 1e-10)")
    counts = pf.role_counts(table)
    log.info(
        "significant heads per role (of %d), pooled over %s:\n%s",
        len(table) // len(roles),
        names,
        counts.to_string(index=False),
    )
    # the same test on each corpus alone (the paper tests each task separately); FDR family = one corpus
    parts, start = [], 0
    for name, n, note in zip(names, sizes, notes):
        part = head_table(scores[start : start + n], roles, model, settings, note)
        part.insert(1, "corpus", name)
        parts.append(part)
        start += n
    by_corpus = pd.concat(parts, ignore_index=True)
    wide = by_corpus.pivot_table(
        index="role", columns="corpus", values="significant_faithful", aggfunc="sum", sort=False
    )
    log.info("faithful-significant heads per role and corpus (pooled: %s):\n%s", dict(zip(counts["role"], counts["faithful"])),
             wide.reindex(columns=names).to_string())  # fmt: skip
    table = with_stability(table, scores.reshape(len(scores), -1), sizes, names, by_corpus, settings)
    lab = table[table["significant_faithful"]]
    if len(lab):
        log.info("faithful labels: median stability %.2f over %d bootstrap resamples; %d of %d hold in every corpus tested",
                 float(lab["stability_faithful"].median()), settings.stability_resamples,
                 int((lab["corpus_share_faithful"] == 1).sum()), len(lab))  # fmt: skip
    return table, by_corpus


def write_table(table: pd.DataFrame, path: str | Path) -> None:
    """The per-head test table (``heads.tsv``, ``by_corpus.tsv``), atomically: missing values as NA."""
    write_tsv(table, path, float_format=FLOAT_FORMAT, na_rep="NA")


def read_table(path: str | Path) -> pd.DataFrame:
    t = pd.read_csv(path, sep="\t", na_values=["NA"], keep_default_na=False)
    for col in ("significant_faithful", "significant_fdr", "significant_nonparam_fdr"):
        if col in t:
            t[col] = t[col].astype(str).str.lower().eq("true")
    return t


def figures(table_path: str | Path, out: dict, near: float = 0.05) -> dict:
    """Every per-model figure and table of the analysis; returns (and writes) a summary."""
    table = read_table(table_path)
    model = str(table["model"].iloc[0])
    pf.role_grid(table, out["grid"], out["grid_svg"])
    coloc = pf.colocation(table)
    write_tsv(coloc, out["colocation"], na_rep="NA")
    pf.colocation_figure(coloc, out["colocation_png"], out["colocation_svg"], model)
    layers = pf.layer_counts(table)
    write_tsv(layers, out["layers"], na_rep="NA")
    pf.layer_figure(layers, out["layers_png"], out["layers_svg"], model)
    share = pf.pvalue_figure(table, out["pvalues"], out["pvalues_svg"], near)
    pf.heatmap_figure(table, out["heatmap"], out["heatmap_svg"])
    counts = pf.role_counts(table)
    ls = coloc[
        ((coloc["role_a"] == "local") & (coloc["role_b"] == "syntactic"))
        | ((coloc["role_a"] == "syntactic") & (coloc["role_b"] == "local"))
    ]
    summary = {
        "model": model,
        "heads": int(len(table) // table["role"].nunique()),
        "roles": counts.to_dict(orient="records"),
        "p_values": share,
        "local_and_syntactic": ls.to_dict(orient="records"),
    }
    with atomic_path(out["summary"]) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def finetune_comparison(base_path: str | Path, tuned_path: str | Path, model_dir: str | Path, out: dict) -> dict:
    """Role counts and mean [SEP]-delimiter score per layer, before and after fine-tuning."""
    before, after = read_table(base_path), read_table(tuned_path)
    base, tuned = str(before["model"].iloc[0]), str(after["model"].iloc[0])
    if head_shape(before) != head_shape(after):
        raise ValueError(
            f"{base_path} and {tuned_path}: models of different shapes {head_shape(before)} / {head_shape(after)}"
        )
    metrics = read_metrics(model_dir)
    subtitle = (
        f"\n{tuned} = {base} fine-tuned on {metrics['task']} for {metrics['steps']} steps: dev accuracy "
        f"{metrics['dev_accuracy']:.1%} (majority baseline {metrics['majority_baseline']:.1%})"
    )
    cmp = pf.compare_layers(before, after)
    cmp.insert(0, "tuned", tuned)
    cmp.insert(0, "base", base)
    write_tsv(cmp, out["table"], na_rep="NA")
    pf.compare_roles_figure(cmp, out["roles"], out["roles_svg"], base, tuned, subtitle)
    pf.compare_sep_figure(before, after, out["sep"], out["sep_svg"], base, tuned, subtitle=subtitle)
    sep = cmp[cmp["role"] == "delimiter_sep"][["layer", "mean_before", "mean_after"]]
    changed = cmp.groupby("layer")["faithful_change"].apply(lambda s: int(s.abs().sum()))
    return {
        "base": base,
        "tuned": tuned,
        "dev_accuracy": metrics["dev_accuracy"],
        "majority_baseline": metrics["majority_baseline"],
        "role_changes_per_layer": changed.to_dict(),
        "sep_mean_per_layer": sep.set_index("layer").round(4).to_dict(orient="index"),
    }


def length_analysis(
    score_paths: list[str | Path], table_path: str | Path, out: dict, n_bins: int = 8, top: int = 3
) -> pd.DataFrame:
    """Sieve score against sequence length: per role, the mean score per corpus and length bin
    of the ``top`` strongest heads and the median head (``out["table"]``, ``out["figure"]`` and ``out["figure_svg"]``), and
    per corpus and role the Spearman correlation of score with length over all heads
    (``out["trend"]``). Returns the trend table."""
    parts = [load_scores(p) for p in score_paths]
    for p, path in zip(parts, score_paths):
        if p["lengths"] is None:
            raise ValueError(
                f"{path}: no 'lengths' dataset (written by an older pande_scores); delete it and rerun pande_scores"
            )
    scores, roles, _, metas, sizes = pooled_scores(score_paths)
    corpora = [str(m["corpus"]) for m in metas]
    lengths = np.concatenate([p["lengths"] for p in parts]) if parts else np.zeros(0, np.int64)
    corpus = np.repeat(np.arange(len(parts)), sizes)
    table = read_table(table_path)
    model = str(table["model"].iloc[0])
    bins = pf.length_table(scores, lengths, corpus, corpora, roles, pf.picked_heads(table, top), n_bins)
    bins.insert(0, "model", model)
    trend = pf.length_trend(scores, lengths, corpus, corpora, roles)
    trend.insert(0, "model", model)
    for df, key in ((bins, "table"), (trend, "trend")):
        write_tsv(df, out[key], na_rep="NA")
    pf.length_figure(bins, roles, out["figure"], out["figure_svg"], model, float(table["tau"].iloc[0]))
    return trend
