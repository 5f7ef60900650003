"""The position analysis's figure: where in a long input heads look, by query position."""

from __future__ import annotations

import pandas as pd

from .reducers import STATS, UNITS


def position_figure(table: pd.DataFrame, title: str = ""):
    """Four panels (sink, local, entropy, distance) against the query position: one line per layer,
    the mean over its heads, coloured from the first layer to the last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(table["layer"].unique())
    mean = table.groupby(["layer", "bucket_start"], as_index=False)[list(STATS)].mean()
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8), constrained_layout=True)
    labels = {
        "sink": "attention to the first token (fraction)",
        "local": "attention within the local window (fraction)",
        "entropy": "row entropy (nats)",
        "distance": "mean attention distance (tokens)",
    }
    for ax, stat in zip(axes, STATS):
        for layer in layers:
            d = mean[mean["layer"] == layer]
            c = cmap(layer / max(1, len(layers) - 1))
            ax.plot(d["bucket_start"] + 1, d[stat], color=c, lw=1.2, marker="o", ms=2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("query position + 1 (tokens, bucket start)")
        ax.set_ylabel(labels[stat])
        ax.set_title(stat)
        if UNITS[stat] == "fraction":
            ax.set_ylim(-0.02, 1.02)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(1, len(layers)))
    fig.colorbar(sm, ax=axes, label="layer (1 = first; each line: mean over the layer's heads)")
    n_seq = int(table["n_sequences"].iloc[0]) if len(table) else 0
    fig.suptitle(f"Where do heads look, by query position: {title} ({n_seq} inputs)")
    return fig
