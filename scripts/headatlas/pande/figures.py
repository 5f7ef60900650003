"""Tables and figures of the heads-hypothesis analysis (Pande et al. 2021, shared methods §1.5).

All functions take the tidy per head x role table of :func:`headatlas.pande.hypothesis.head_table`
(or two of them, before and after fine-tuning) and return frames or write figures.
Layers and heads are labelled 1-based on every axis and in legends (``head_label``, ``8-10``); in
layers x heads grids layer 1 is at the top and head 1 at the left (core.figures.layer_head_axes).
The tables keep 0-based ``layer``/``head`` columns.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.figures import head_label, layer_head_axes, layer_ticks, panel_columns, save_figure
from ..core.io import head_shape, layer_count
from .roles import figure_order

MODES = {"faithful": "significant_faithful", "fdr": "significant_fdr"}
MODE_TITLES = {
    "faithful": "faithful: t-test p < alpha, no correction",
    "fdr": "rigorous: Benjamini-Hochberg FDR < alpha",
}
_MARKERS = ["o", "*", "s", "^", "v", "D", "P", "X", "h", "<", ">", "p", "d", "8", "H", "1", "2", "3"]
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#ff7f0e", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]


def ordered_roles(roles) -> list[str]:
    """``roles`` in figure order (:func:`headatlas.pande.roles.figure_order`: the paper's four role families
    first), then the others (per-relation roles) as given."""
    roles = list(dict.fromkeys(roles))
    first = [r for r in figure_order() if r in roles]
    return first + [r for r in roles if r not in first]


def role_styles(roles) -> dict[str, tuple[str, str]]:
    return {r: (_MARKERS[i % len(_MARKERS)], _COLORS[i % len(_COLORS)]) for i, r in enumerate(ordered_roles(roles))}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def membership(table: pd.DataFrame, mode: str = "faithful") -> pd.DataFrame:
    """Wide boolean frame: one row per (layer, head), one column per role."""
    col = MODES[mode]
    wide = table.pivot_table(index=["layer", "head"], columns="role", values=col, aggfunc="first", observed=True)
    wide = wide.reindex(columns=ordered_roles(table["role"].unique())).fillna(False).astype(bool)
    return wide


def role_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per role: tested heads, heads significant (faithful, FDR), sentences n."""
    rows = []
    for role in ordered_roles(table["role"].unique()):
        t = table[table["role"] == role]
        rows.append(
            {
                "role": role,
                "heads": len(t),
                "tested": int(t["p"].notna().sum()),
                "n": int(t["n"].max()),
                "faithful": int(t["significant_faithful"].sum()),
                "fdr": int(t["significant_fdr"].sum()),
            }
        )
    return pd.DataFrame(rows)


def colocation(table: pd.DataFrame) -> pd.DataFrame:
    """For each pair of roles and each mode: heads holding both roles, as a count and as a
    share of all heads, of the first role's heads and of the second role's heads."""
    rows = []
    n_heads = len(membership(table))
    for mode in MODES:
        m = membership(table, mode)
        for a, b in itertools.combinations(m.columns, 2):
            na, nb, both = int(m[a].sum()), int(m[b].sum()), int((m[a] & m[b]).sum())
            rows.append(
                {
                    "mode": mode,
                    "role_a": a,
                    "role_b": b,
                    "heads_a": na,
                    "heads_b": nb,
                    "both": both,
                    "share_of_all": both / n_heads,
                    "share_of_a": both / na if na else np.nan,
                    "share_of_b": both / nb if nb else np.nan,
                }
            )
    return pd.DataFrame(rows)


def layer_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per layer and role: heads significant (faithful, FDR) and the mean sieve score."""
    t = table.assign(role=pd.Categorical(table["role"], categories=list(dict.fromkeys(table["role"]))))
    g = t.groupby(["layer", "role"], sort=True, observed=True)
    out = g.agg(
        heads=("head", "size"),
        faithful=("significant_faithful", "sum"),
        fdr=("significant_fdr", "sum"),
        mean_score=("mean", "mean"),
    ).reset_index()
    out["role"] = out["role"].astype(str)
    return out


def p_value_share(table: pd.DataFrame, near: float = 0.05) -> dict:
    """Share of the finite faithful p-values below ``near`` or above 1 - ``near``."""
    p = table["p"].to_numpy(dtype=float)
    p = p[np.isfinite(p)]
    if not len(p):
        return {"tests": 0, "near_0": 0, "near_1": 0, "share_near_0_or_1": np.nan, "near": near}
    n0, n1 = int((p < near).sum()), int((p > 1 - near).sum())
    return {"tests": int(len(p)), "near_0": n0, "near_1": n1, "share_near_0_or_1": (n0 + n1) / len(p), "near": near}


def role_grid(table: pd.DataFrame, path: str | Path, svg: str | Path) -> None:
    """Layers x heads grid, one marker per role a head holds; faithful and FDR side by side."""
    plt = _plt()
    n_layers, n_heads = head_shape(table)
    roles = ordered_roles(table["role"].unique())
    styles = role_styles(roles)
    cols = 5 if len(roles) > 4 else len(roles)
    rows = int(np.ceil(len(roles) / cols))
    offsets = {
        r: ((i % cols - (cols - 1) / 2) * 0.8 / cols, ((i // cols) - (rows - 1) / 2) * 0.7 / max(rows, 1))
        for i, r in enumerate(roles)
    }
    width = max(4.0, 0.55 * n_heads + 1) + 1.25  # + the legend
    height = max(3.0, 0.42 * n_layers + 1.2)
    ncol = panel_columns(2, width)  # the two modes side by side when they fit, else one above the other
    fig, axes = plt.subplots(2 // ncol, ncol, figsize=(width * ncol, height * (2 // ncol)), squeeze=False)
    axes = axes.ravel()
    model = table["model"].iloc[0]
    for ax, mode in zip(axes, MODES):
        m = membership(table, mode)
        for role in roles:
            hit = m[role]
            lh = np.array([k for k, v in hit.items() if v]).reshape(-1, 2)
            dx, dy = offsets[role]
            marker, color = styles[role]
            ax.scatter(
                lh[:, 1] + dx,
                lh[:, 0] + dy,
                marker=marker,
                color=color,
                s=22,
                label=f"{role} ({len(lh)})",
                linewidths=0.6,
            )
        layer_head_axes(ax, n_layers, n_heads, fontsize=8)
        ax.set_xticks(np.arange(-0.5, n_heads), minor=True)
        ax.set_yticks(np.arange(-0.5, n_layers), minor=True)
        ax.grid(which="minor", color="0.85", linewidth=0.6)
        ax.tick_params(which="minor", length=0)
        ax.set_title(MODE_TITLES[mode], fontsize=9)
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize=7,
            title="role (heads)",
            title_fontsize=7,
            frameon=False,
        )
    tau = table["tau"].iloc[0]
    fig.suptitle(f"{model}: roles per head (H0: mean sieve score <= tau = {tau:g})", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, svg)


def colocation_figure(coloc: pd.DataFrame, path: str | Path, svg: str | Path, model: str) -> None:
    """Heat maps of heads holding both roles (count, share of all heads), faithful and FDR."""
    plt = _plt()
    roles = ordered_roles(list(coloc["role_a"]) + list(coloc["role_b"]))
    k = len(roles)
    fig, axes = plt.subplots(1, 2, figsize=(2 * (0.55 * k + 2.5), 0.55 * k + 2))
    for ax, mode in zip(axes, MODES):
        c = coloc[coloc["mode"] == mode]
        mat = np.full((k, k), np.nan)
        share = np.full((k, k), np.nan)
        for _, row in c.iterrows():
            i, j = roles.index(row["role_a"]), roles.index(row["role_b"])
            mat[i, j] = mat[j, i] = row["both"]
            share[i, j] = share[j, i] = row["share_of_all"]
        for i, r in enumerate(roles):
            own = c[c["role_a"] == r]["heads_a"].tolist() + c[c["role_b"] == r]["heads_b"].tolist()
            mat[i, i] = own[0] if own else np.nan
        im = ax.imshow(mat, cmap="Blues")
        for i in range(k):
            for j in range(k):
                if np.isfinite(mat[i, j]):
                    txt = f"{int(mat[i, j])}" if i == j else f"{int(mat[i, j])}\n{share[i, j]:.0%}"
                    ax.text(j, i, txt, ha="center", va="center", fontsize=6, color="black")
        ax.set_xticks(range(k), roles, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(k), roles, fontsize=7)
        ax.set_title(MODE_TITLES[mode], fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.7, label="heads holding both roles (diagonal: the role's heads)")
    fig.suptitle(f"{model}: co-location of roles (count; share of all heads)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, svg)


def layer_figure(counts: pd.DataFrame, path: str | Path, svg: str | Path, model: str) -> None:
    """Per layer, the count of heads in each role (faithful and FDR)."""
    plt = _plt()
    roles = ordered_roles(counts["role"].unique())
    styles = role_styles(roles)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    n_heads = int(counts["heads"].max())
    jitter = dict(zip(roles, np.linspace(-0.2, 0.2, len(roles))))  # keeps equal counts apart
    for ax, mode in zip(axes, MODES):
        for role in roles:
            c = counts[counts["role"] == role]
            marker, color = styles[role]
            ax.plot(
                c["layer"] + jitter[role], c[mode], marker=marker, color=color, label=role, linewidth=1, markersize=4
            )
        ax.set_xticks(*layer_ticks(layer_count(counts)))
        ax.set_xlabel("layer (1-based)")
        ax.set_ylim(-0.3, n_heads + 0.3)
        ax.set_title(MODE_TITLES[mode], fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"heads with the role (of {n_heads})")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False, title="role")
    fig.suptitle(f"{model}: heads per role and layer", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, svg)


def pvalue_figure(table: pd.DataFrame, path: str | Path, svg: str | Path, near: float = 0.05) -> dict:
    """Faithful p-values of every head x role test with a marginal histogram."""
    plt = _plt()
    share = p_value_share(table, near)
    roles = ordered_roles(table["role"].unique())
    styles = role_styles(roles)
    fig = plt.figure(figsize=(11, 4.2))
    grid = fig.add_gridspec(1, 2, width_ratios=(5, 1), wspace=0.03)
    ax = fig.add_subplot(grid[0])
    hist = fig.add_subplot(grid[1], sharey=ax)
    x0 = 0
    for role in roles:
        t = table[table["role"] == role]
        p = t["p"].to_numpy(dtype=float)
        xs = x0 + np.arange(len(p))
        marker, color = styles[role]
        ok = np.isfinite(p)
        ax.scatter(xs[ok], p[ok], s=6, color=color, marker="o", label=role, alpha=0.8, linewidths=0)
        x0 += len(p)
    ax.axhspan(0, near, color="0.9", zorder=0)
    ax.axhspan(1 - near, 1, color="0.9", zorder=0)
    ax.set_xlabel("test index (role, then layer, head)")
    ax.set_ylabel("faithful p-value (one-sided t-test)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.18), ncol=5, fontsize=7, frameon=False, markerscale=2)
    p = table["p"].to_numpy(dtype=float)
    hist.hist(p[np.isfinite(p)], bins=20, range=(0, 1), orientation="horizontal", color="0.4")
    hist.set_xlabel("tests")
    hist.tick_params(labelleft=False)
    model = table["model"].iloc[0]
    fig.suptitle(
        f"{model}: {share['share_near_0_or_1']:.1%} of {share['tests']} p-values lie within {near:g} of 0 or 1 "
        f"(paper: about 98%)",
        fontsize=10,
    )
    save_figure(fig, path, svg)
    return share


def heatmap_figure(table: pd.DataFrame, path: str | Path, svg: str | Path) -> None:
    """Mean sieve score per head, one panel per role (log colour scale, tau marked)."""
    from matplotlib.colors import LogNorm

    plt = _plt()
    n_layers, n_heads = head_shape(table)
    roles = ordered_roles(table["role"].unique())
    panel_w = max(2.4, 0.3 * n_heads + 1.2)
    cols = panel_columns(len(roles), panel_w)
    rows = int(np.ceil(len(roles) / cols))
    means = table["mean"].to_numpy(dtype=float)
    pos = means[np.isfinite(means) & (means > 0)]
    vmin, vmax = (max(pos.min(), 1e-2), max(pos.max(), 10.0)) if len(pos) else (0.1, 10.0)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(cols * panel_w + 1.2, rows * max(2.4, 0.2 * n_layers + 1.6)),
        squeeze=False,
        layout="constrained",
    )
    im = None
    for ax, role in zip(axes.ravel(), roles):
        t = table[table["role"] == role]
        mat = np.full((n_layers, n_heads), np.nan)
        mat[t["layer"], t["head"]] = t["mean"]
        im = ax.imshow(np.clip(mat, vmin, None), norm=norm, cmap="magma", aspect="auto")
        sig = t[t["significant_faithful"]]
        ax.scatter(sig["head"], sig["layer"], s=4, color="cyan", marker="o", linewidths=0)
        ax.set_title(f"{role} (n={int(t['n'].max())})", fontsize=8)
        layer_head_axes(ax, n_layers, n_heads, fontsize=6)
    for ax in axes.ravel()[len(roles) :]:
        ax.axis("off")
    model = table["model"].iloc[0]
    tau = table["tau"].iloc[0]
    if im is not None:
        bar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="mean sieve score (1 = uniform attention)")
        if np.isfinite(tau) and vmin < tau < vmax:
            bar.ax.axhline(tau, color="cyan", linewidth=1.5)
    fig.suptitle(
        f"{model}: mean sieve score per head (cyan dots: faithful-significant at tau = {tau:g}, cyan line on the bar)",
        fontsize=10,
    )
    save_figure(fig, path, svg)


# --- fine-tuning comparison ---------------------------------------------------------------


def compare_layers(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per layer and role: role counts and mean sieve score before and after fine-tuning."""
    a = layer_counts(before).rename(
        columns={"faithful": "faithful_before", "fdr": "fdr_before", "mean_score": "mean_before"}
    )
    b = layer_counts(after).rename(
        columns={"faithful": "faithful_after", "fdr": "fdr_after", "mean_score": "mean_after"}
    )
    out = a.merge(b.drop(columns="heads"), on=["layer", "role"], how="outer", validate="one_to_one")
    out["faithful_change"] = out["faithful_after"] - out["faithful_before"]
    out["mean_change"] = out["mean_after"] - out["mean_before"]
    return out


def compare_roles_figure(
    cmp: pd.DataFrame, path: str | Path, svg: str | Path, base: str, tuned: str, subtitle: str = ""
) -> None:
    """Heads per role and layer before and after fine-tuning, one panel per role."""
    plt = _plt()
    roles = ordered_roles(cmp["role"].unique())
    cols = min(5, len(roles))
    rows = int(np.ceil(len(roles) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3.0, rows * 2.6), squeeze=False, sharex=True, sharey=True)
    n_heads = int(cmp["heads"].max())
    for ax, role in zip(axes.ravel(), roles):
        c = cmp[cmp["role"] == role]
        ax.plot(
            c["layer"],
            c["faithful_before"],
            marker="o",
            color="0.45",
            label=f"{base} (before)",
            linewidth=1,
            markersize=3,
        )
        ax.plot(
            c["layer"],
            c["faithful_after"],
            marker="s",
            color="#d62728",
            label=f"{tuned} (after)",
            linewidth=1,
            markersize=3,
        )
        ax.set_title(role, fontsize=8)
        ax.set_ylim(-0.3, n_heads + 0.3)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(roles) :]:
        ax.axis("off")
    n_layers = layer_count(cmp)
    for ax in axes.ravel():
        ax.set_xticks(*layer_ticks(n_layers))
    for ax in axes[-1]:
        ax.set_xlabel("layer (1-based)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("heads with the role", fontsize=7)
    axes[0, 0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"Heads per role and layer before and after fine-tuning (faithful test){subtitle}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, svg)


def compare_sep_figure(
    before: pd.DataFrame,
    after: pd.DataFrame,
    path: str | Path,
    svg: str | Path,
    base: str,
    tuned: str,
    role: str = "delimiter_sep",
    subtitle: str = "",
) -> None:
    """Mean sieve score of ``role`` per layer before and after fine-tuning (heads as dots)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for table, name, color, shift in (
        (before, f"{base} (before)", "0.45", -0.12),
        (after, f"{tuned} (after)", "#d62728", 0.12),
    ):
        t = table[table["role"] == role]
        ax.scatter(t["layer"] + shift, t["mean"], s=8, color=color, alpha=0.5, linewidths=0)
        m = t.groupby("layer")["mean"].mean()
        ax.plot(m.index, m.values, marker="o", color=color, label=f"{name}: layer mean", linewidth=1.5)
    tau = before["tau"].iloc[0]
    if np.isfinite(tau):
        ax.axhline(tau, color="black", linestyle="--", linewidth=0.8, label=f"tau = {tau:g}")
    ax.axhline(1, color="black", linestyle=":", linewidth=0.8, label="uniform attention = 1")
    if not np.isfinite(before.loc[before["role"] == role, "mean"].to_numpy(dtype=float)).any():
        ax.text(0.5, 0.5, f"no {role} score: the inputs have no [SEP] token", transform=ax.transAxes, ha="center")
    ax.set_yscale("log")
    ax.set_xticks(*layer_ticks(layer_count(before)))
    ax.set_xlabel("layer (1-based)")
    ax.set_ylabel(f"mean {role} sieve score per head")
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(f"Attention to [SEP] before and after fine-tuning (dots: heads){subtitle}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, svg)


# --- score against sequence length ----------------------------------------------------------

_CORPUS_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def length_bin_edges(lengths: np.ndarray, n_bins: int = 8) -> np.ndarray:
    """Integer bin edges of equal width over the sequence lengths (bin k: edges[k] <= n < edges[k + 1])."""
    lengths = np.asarray(lengths)
    if not len(lengths):
        return np.array([0, 1])
    lo, hi = int(lengths.min()), int(lengths.max()) + 1
    return np.unique(np.round(np.linspace(lo, hi, n_bins + 1)).astype(np.int64))


def picked_heads(table: pd.DataFrame, top: int = 3) -> pd.DataFrame:
    """Per role: the ``top`` heads with the highest pooled mean score and the median head
    (rank len // 2 of the heads with a mean), as rows role, pick, layer, head, head_mean."""
    t = table[np.isfinite(table["mean"].to_numpy(dtype=float))]
    rows = []
    for role in ordered_roles(table["role"].unique()):
        r = t[t["role"] == role].sort_values(["mean", "layer", "head"], ascending=[False, True, True], kind="stable")
        if r.empty:
            continue
        picks = [(f"strongest {k + 1}", r.iloc[k]) for k in range(min(top, len(r)))]
        picks.append(("median", r.iloc[len(r) // 2]))
        rows += [
            {
                "role": role,
                "pick": name,
                "layer": int(h["layer"]),
                "head": int(h["head"]),
                "head_mean": float(h["mean"]),
            }
            for name, h in picks
        ]
    return pd.DataFrame(rows, columns=["role", "pick", "layer", "head", "head_mean"])


def length_table(
    scores: np.ndarray,
    lengths: np.ndarray,
    corpus: np.ndarray,
    corpora: list[str],
    roles: list[str],
    picks: pd.DataFrame,
    n_bins: int = 8,
) -> pd.DataFrame:
    """Mean sentence score of each picked head per corpus and length bin.

    ``scores`` [N, L, H, R] (NaN = no query or pair), ``lengths`` [N] tokens, ``corpus`` [N]
    index into ``corpora``; ``picks`` from :func:`picked_heads`. All picks are gathered at once
    and summed per (corpus, bin) with ``np.add.at``."""
    cols = [
        "role",
        "pick",
        "layer",
        "head",
        "head_mean",
        "corpus",
        "bin_low",
        "bin_high",
        "mean_length",
        "sentences",
        "mean_score",
    ]
    if picks.empty or not len(scores):
        return pd.DataFrame(columns=cols)
    edges = length_bin_edges(lengths, n_bins)
    nb = len(edges) - 1
    b = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, nb - 1)
    g = np.asarray(corpus) * nb + b  # [N] group
    r_idx = picks["role"].map({r: i for i, r in enumerate(roles)}).to_numpy()
    v = scores[:, picks["layer"].to_numpy(), picks["head"].to_numpy(), r_idx].astype(np.float64)  # [N, K]
    ok = ~np.isnan(v)
    groups = len(corpora) * nb
    sums = np.zeros((groups, v.shape[1]))
    cnt = np.zeros((groups, v.shape[1]))
    lsum = np.zeros((groups, v.shape[1]))
    np.add.at(sums, g, np.where(ok, v, 0.0))
    np.add.at(cnt, g, ok.astype(np.float64))
    np.add.at(lsum, g, ok * np.asarray(lengths, dtype=np.float64)[:, None])
    gi, k = np.nonzero(cnt > 0)
    ci, bi = np.divmod(gi, nb)
    out = picks.iloc[k].reset_index(drop=True)
    out["corpus"] = np.asarray(corpora, dtype=object)[ci]
    out["bin_low"] = edges[bi]
    out["bin_high"] = edges[bi + 1]
    out["mean_length"] = lsum[gi, k] / cnt[gi, k]
    out["sentences"] = cnt[gi, k].astype(np.int64)
    out["mean_score"] = sums[gi, k] / cnt[gi, k]
    order = pd.Categorical(out["pick"], categories=list(dict.fromkeys(picks["pick"])))
    out = out.assign(_r=out["role"].map({r: i for i, r in enumerate(roles)}), _p=order.codes)
    return (
        out.sort_values(["_r", "_p", "corpus", "bin_low"], kind="stable")
        .drop(columns=["_r", "_p"])[cols]
        .reset_index(drop=True)
    )


def length_trend(
    scores: np.ndarray, lengths: np.ndarray, corpus: np.ndarray, corpora: list[str], roles: list[str]
) -> pd.DataFrame:
    """Per corpus and role, over every head: Spearman correlation between a sentence's length
    and its score (heads with at least 3 sentences and some spread); the median and the share
    of heads with a positive correlation."""
    from scipy import stats

    n_seq = len(scores)
    x = scores.reshape(n_seq, -1, len(roles)).astype(np.float64)  # [N, heads, R]
    rows = []
    for c, name in enumerate(corpora):
        sel = np.asarray(corpus) == c
        for r, role in enumerate(roles):
            v = x[sel, :, r]
            rows_ok = ~np.isnan(v).any(1)  # a role's heads share their sentences
            v, n = v[rows_ok], np.asarray(lengths, dtype=np.float64)[sel][rows_ok]
            rho = np.full(v.shape[1], np.nan)
            if len(v) >= 3 and np.ptp(n) > 0:
                rv = stats.rankdata(v, axis=0)
                rn = stats.rankdata(n)
                rv -= rv.mean(0)
                rn -= rn.mean()
                with np.errstate(invalid="ignore", divide="ignore"):
                    rho = (rv * rn[:, None]).sum(0) / np.sqrt((rv**2).sum(0) * (rn**2).sum())
            fin = rho[np.isfinite(rho)]
            rows.append({"corpus": name, "role": role, "sentences": int(len(v)), "heads": int(len(fin)),
                         "median_spearman": float(np.median(fin)) if len(fin) else np.nan,
                         "share_positive": float((fin > 0).mean()) if len(fin) else np.nan})  # fmt: skip
    return pd.DataFrame(rows, columns=["corpus", "role", "sentences", "heads", "median_spearman", "share_positive"])


def length_figure(
    bins: pd.DataFrame, roles: list[str], path: str | Path, svg: str | Path, model: str, tau: float
) -> None:
    """Per role: mean score per length bin of the strongest heads and the median head, one
    marker per corpus, one colour per head."""
    plt = _plt()
    roles = ordered_roles(roles)
    cols = min(5, max(1, len(roles)))
    rows = int(np.ceil(max(1, len(roles)) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3.3, rows * 2.9 + 0.8), squeeze=False)
    corpora = list(dict.fromkeys(bins["corpus"])) if len(bins) else []
    markers = {c: _CORPUS_MARKERS[i % len(_CORPUS_MARKERS)] for i, c in enumerate(corpora)}
    for ax, role in zip(axes.ravel(), roles):
        b = bins[bins["role"] == role]
        picks = list(dict.fromkeys(b["pick"]))
        for i, pick in enumerate(picks):
            colour = "0.35" if pick == "median" else _COLORS[i % len(_COLORS)]
            p = b[b["pick"] == pick]
            label = f"{pick}: {head_label(p['layer'].iloc[0], p['head'].iloc[0])}"
            for corpus, q in p.groupby("corpus", sort=False):
                ax.plot(q["mean_length"], q["mean_score"], marker=markers[corpus], color=colour, linewidth=0.9, markersize=3.5,
                        linestyle="--" if pick == "median" else "-", label=label)  # fmt: skip
                label = None
        if b.empty:
            ax.text(0.5, 0.5, "no head with a score", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        elif np.isfinite(tau):
            ax.axhline(tau, color="black", linewidth=0.7, linestyle=":")
        ax.set_title(role, fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
        if len(picks):
            ax.legend(fontsize=5.5, frameon=False, title="head (layer-head)", title_fontsize=5.5)
    for ax in axes.ravel()[len(roles) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length n (tokens; bin mean)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean sentence score in the bin", fontsize=7)
    handles = [plt.Line2D([], [], marker=m, color="black", linestyle="none", label=c) for c, m in markers.items()]
    if handles:
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=len(handles),
            fontsize=7,
            frameon=False,
            title="corpus (marker)",
            title_fontsize=7,
        )
    fig.suptitle(
        f"{model}: sieve score against sequence length (dotted: tau = {tau:g}; dashed grey: the median head)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_figure(fig, path, svg)
