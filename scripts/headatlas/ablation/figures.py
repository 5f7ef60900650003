"""Pruning curves: the metric against the number of heads removed, one line per removal order."""

from __future__ import annotations

import pandas as pd

from ..core.figures import save_figure

ORDER_STYLE = {
    "atlas": ("least specialised first (atlas)", "tab:blue"),
    "ablation": ("least needed first (ablation effect)", "tab:orange"),
    "random": ("random order", "tab:gray"),
}
METRIC_LABEL = {"loss": "next-token loss (nats)", "accuracy": "dev accuracy (fraction)"}


def pruning_figure(pruning: pd.DataFrame, model: str, png, svg) -> None:
    """One panel per (task, main metric) with a CI band per order; a note where nothing was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = pruning[pruning["status"] == "ok"]
    panels = [(t, "loss" if t == "lm" else "accuracy") for t in dict.fromkeys(ok["task"])]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 4), squeeze=False)
    for ax, (task, metric) in zip(axes[0], panels):
        d = ok[(ok["task"] == task) & (ok["metric"] == metric)]
        for order, (label, colour) in ORDER_STYLE.items():
            o = d[d["order"] == order].sort_values("n_removed")
            if len(o):
                ax.plot(o["n_removed"], o["value"], "o-", color=colour, label=label)
                ax.fill_between(o["n_removed"], o["ci_low"], o["ci_high"], color=colour, alpha=0.2)
        n = int(d["n_sequences"].iloc[0]) if len(d) else 0
        what = "next-token loss" if task == "lm" else "classification"
        pos = d[d["n_removed"] > 0]
        total = int(round(pos["n_removed"].iloc[0] / pos["fraction"].iloc[0])) if len(pos) else 0
        ax.set_title(f"{model}: {what} ({n} sequences; bands: bootstrap CI)")
        ax.set_xlabel(f"heads removed (count, of {total})")
        ax.set_ylabel(METRIC_LABEL[metric])
        ax.legend(fontsize=8)
    if not panels:
        ax = axes[0][0]
        reasons = "; ".join(f"{t}: {r}" for t, r in zip(pruning["task"], pruning["reason"].fillna("")))
        ax.text(0.5, 0.5, f"{model}: no ablation measured\n{reasons}", ha="center", va="center", wrap=True, fontsize=8)
        ax.set_title(f"{model}: pruning curves (skipped)")
        ax.set_xlabel("heads removed (count)")
        ax.set_ylabel("metric")
    fig.suptitle("Pruning heads cumulatively (mean ablation)" if len(ok) == 0 or ok["mode"].iloc[0] == "mean"
                 else "Pruning heads cumulatively (zero ablation)")  # fmt: skip
    fig.tight_layout()
    save_figure(fig, png, svg)
