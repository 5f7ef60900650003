"""A run's atlas as the static ``data/`` tree of Anthropic's HeadVis viewer (``headatlas export headvis``).

The layout and every JSON shape follow the data contract in HeadVis's ``data_pipeline.py`` docstrings
(github.com/anthropics/headvis; the README says they are exact); ``tests/headvis_schema.json`` states
them as JSON Schema:

- ``data/config.json``: ``model_name``, ``heads`` ([layer, head] of every head), ``n_layers``, ``n_heads``,
  ``n_intervals``, ``metrics`` (the scatter axes: every numeric atlas column, plus HeadVis's own names for
  the four that are the same quantity, e.g. ``previous_token_score`` = ``det_prev``),
  ``metric_descriptions`` (the column registry's text), ``head_data_pattern``, ``has_umap`` (false: no
  Q/K/O/V projection is exported), ``umap_heads``, ``custom_plots``, ``custom_tables``,
  ``statistics_display``;
- ``data/scatter_data.json``: one flat row per head, ``{"layer", "head", <metric>: float}`` (null where the
  atlas has no value for that head);
- ``data/heads/L{l}H{h}.json``: ``sequences`` (the token-level maps of sequences with stored maps:
  ``sequence_id``, ``interval`` 1..10 by decile of ``max_activation``, ``tokens``, sparse COO
  ``attention_indices`` (q * seq_len + k) and ``attention_values``: the top 8 keys per query above 0.005,
  4 decimals), ``qk_distance_histogram``, ``top_query_tokens``, ``top_key_tokens``, ``histogram`` and
  ``statistics`` (every atlas value of the head, text, flags, CIs and value kinds included);
- ``data/server_config.json`` ``{}`` (static-only mode) and ``data/attributions/manifest.json`` ``{}``.

Layers and heads are 0-based, as in the atlas TSV (HeadVis displays them as given). The tree is written to
a temporary directory and moved into place whole. :func:`export_run` writes every model of a run: ``OUT/data``
for a run with one atlas (or the model chosen), ``OUT/<model>/data`` for each model of a run with several.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.io import head_shape
from ..core.reduce import map_dirs
from ..core.reducer import ReduceError
from ..core.store import AttentionStore, StoreError, store_dirs
from . import columns as registry

N_INTERVALS = 10
TOP_K, MIN_WEIGHT = 8, 0.005  # sparse attention: the top K keys of each query with at least this weight
ID_COLUMNS = ("model", "layer", "head", "label")
# HeadVis's metric names for atlas columns that measure the same thing
HEADVIS_NAMES = {
    "previous_token_score": "det_prev",
    "induction_score": "det_induction",
    "self_attention_score": "clark_self",
    "pattern_entropy": "clark_entropy",
}
DISTANCE_EDGES = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


class ExportError(ValueError):
    """The run cannot be exported (no atlas, an unknown model); one line."""


def atlas_names(results: str | Path) -> list[str]:
    """The models with an atlas under ``results/atlas/``."""
    root = Path(results) / "atlas"
    return sorted(p.parent.name for p in root.glob("*/atlas.tsv")) if root.is_dir() else []


def _number(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, 6) if np.isfinite(f) else None


def _plain(v):
    """An atlas value as JSON: number, bool, text or None."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return round(float(v), 6)
    if pd.isna(v):
        return None
    return str(v)


def metric_columns(atlas: pd.DataFrame) -> list[str]:
    """Every numeric (not true/false) atlas column: the scatter axes."""
    out = []
    for c in atlas.columns:
        if c in ID_COLUMNS:
            continue
        s = atlas[c]
        if pd.api.types.is_bool_dtype(s) or set(s.dropna().map(str)) <= {"True", "False"} and len(s.dropna()):
            continue
        if pd.api.types.is_numeric_dtype(s):
            out.append(c)
    return out


def sparse_attention(a: np.ndarray) -> tuple[list[int], list[float]]:
    """A [n, n] map as COO: flat indices q * n + k of the top :data:`TOP_K` keys of every query with weight
    at least :data:`MIN_WEIGHT`, in increasing order, and their weights to 4 decimals."""
    n = a.shape[-1]
    k = min(TOP_K, n)
    top = np.argpartition(-a, k - 1, axis=-1)[:, :k]
    keep = np.zeros_like(a, dtype=bool)
    np.put_along_axis(keep, top, True, axis=-1)
    keep &= a >= MIN_WEIGHT
    flat = np.flatnonzero(keep)
    return flat.tolist(), [round(float(x), 4) for x in a.reshape(-1)[flat].astype(np.float64)]


def max_activation(a: np.ndarray) -> float:
    """HeadVis's max-reduction: the largest weight off the diagonal, row 0 and column 0 skipped."""
    n = a.shape[-1]
    if n < 3:
        return 0.0
    b = a[1:, 1:].astype(np.float64).copy()
    np.fill_diagonal(b, -np.inf)
    return float(max(b.max(), 0.0))


def intervals(values: list[float]) -> list[int]:
    """Decile (1..N_INTERVALS, N = highest) of each value by rank among ``values``."""
    n = len(values)
    order = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    return [int(1 + (r * N_INTERVALS) // n) for r in order] if n else []


def head_sequences(store, positions: list[int]) -> list[list[dict]]:
    """Per head (layer-major), the HeadVis sequences of the store's sequences ``positions``."""
    L, H = store.n_layers, store.n_heads
    out: list[list[dict]] = [[] for _ in range(L * H)]
    for k in positions:
        t = store.tokens(k)
        tokens = [str(p) for p in t["piece"]]
        for layer in range(L):
            maps = store.maps(layer, k)
            for h in range(H):
                idx, val = sparse_attention(maps[h])
                out[layer * H + h].append({
                    "sequence_id": int(k), "interval": 0, "tokens": tokens, "attention_indices": idx,
                    "attention_values": val, "seq_len": len(tokens), "max_activation": round(max_activation(maps[h]), 4),
                })  # fmt: skip
    for seqs in out:
        for s, iv in zip(seqs, intervals([s["max_activation"] for s in seqs])):
            s["interval"] = iv
    return out


def distance_histogram(sequences: list[dict]) -> dict:
    """Histogram of |q - k| over the stored (top) attention pairs, log-spaced edges."""
    d = [abs(i // s["seq_len"] - i % s["seq_len"]) for s in sequences for i in s["attention_indices"]]
    longest = max([s["seq_len"] for s in sequences], default=1)
    edges = [e for e in DISTANCE_EDGES if e <= longest] + [next(e for e in DISTANCE_EDGES if e > longest)]
    counts, _ = np.histogram(d, bins=edges)
    return {"bin_edges": edges, "bin_values": [int(c) for c in counts]}


def top_tokens(sequences: list[dict], side: str, n: int = 20) -> list[dict]:
    """Tokens by the attention mass of the stored pairs on the query or key side (share of the total)."""
    mass: dict[str, float] = {}
    for s in sequences:
        for i, v in zip(s["attention_indices"], s["attention_values"]):
            pos = i // s["seq_len"] if side == "query" else i % s["seq_len"]
            mass[s["tokens"][pos]] = mass.get(s["tokens"][pos], 0.0) + v
    total = sum(mass.values()) or 1.0
    ranked = sorted(mass.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{"token": t, "weight": round(w / total, 4)} for t, w in ranked]


def find_atlas(run_dir: str | Path, model: str | None) -> tuple[str, Path]:
    """(model, atlas.tsv) of a run directory (``results/``) or of one model's atlas directory."""
    run = Path(run_dir)
    if (run / "atlas.tsv").is_file():
        return model or run.name, run / "atlas.tsv"
    have = atlas_names(run)
    if not have:
        raise ExportError(
            f"{run}: no atlas (expected {run / 'atlas' / '<model>' / 'atlas.tsv'}): run the workflow first"
        )
    if model is None:
        if len(have) > 1:
            raise ExportError(f"{run} holds the atlases of {', '.join(have)}: choose one with --model")
        model = have[0]
    if model not in have:
        raise ExportError(f"{run}: no atlas of model {model!r} (atlases: {', '.join(have)})")
    return model, run / "atlas" / model / "atlas.tsv"


def export_run(
    run_dir: str | Path, out: str | Path, model: str | None = None, corpus: str = "ewt_dev", n_sequences: int = 40
) -> list[tuple[str, Path]]:
    """Every model of a run, [(model, data directory)]: ``OUT/<model>/data`` for each model of a run with
    several atlases, ``OUT/data`` for a run with one atlas, a model's atlas directory, or ``model`` chosen."""
    run = Path(run_dir)
    if model is None and not (run / "atlas.tsv").is_file():
        have = atlas_names(run)
        if len(have) > 1:
            return [(m, export_headvis(run, Path(out) / m, m, corpus, n_sequences)) for m in have]
    model, _ = find_atlas(run, model)
    return [(model, export_headvis(run, out, model, corpus, n_sequences))]


def export_headvis(
    run_dir: str | Path, out: str | Path, model: str | None = None, corpus: str = "ewt_dev", n_sequences: int = 40
) -> Path:
    """Write ``out/data`` for one model of a run (see the module doc); returns the data directory. The
    sequences are the first ``n_sequences`` with stored maps of ``corpus`` (its ``sample/`` stores for a
    ``maps: sample`` corpus; none when the run kept no maps of it)."""
    model, atlas_path = find_atlas(run_dir, model)
    atlas = pd.read_csv(atlas_path, sep="\t").sort_values(["layer", "head"]).reset_index(drop=True)
    n_layers, n_heads = head_shape(atlas)
    metrics = metric_columns(atlas)
    aliases = {k: v for k, v in HEADVIS_NAMES.items() if v in metrics}
    names = metrics + list(aliases)
    desc = {c: registry.describe(c).text() for c in metrics}
    desc.update({k: f"{registry.describe(v).text()}; the atlas column {v}" for k, v in aliases.items()})

    corpus_dir = Path(run_dir) / "attention" / model / corpus
    sequences: list[list[dict]] = [[] for _ in range(len(atlas))]
    source = f"no stored maps of corpus {corpus} for {model}"
    if corpus_dir.is_dir():
        try:
            dirs = map_dirs(store_dirs(corpus_dir), "the HeadVis export")
            with AttentionStore(dirs) as store:
                if (store.n_layers, store.n_heads) != (n_layers, n_heads):
                    raise ExportError(
                        f"{corpus_dir}: {store.n_layers} x {store.n_heads} heads, the atlas {n_layers} x {n_heads}"
                    )
                sequences = head_sequences(store, list(range(min(n_sequences, len(store)))))
                source = f"{min(n_sequences, len(store))} sequences of {corpus} with stored maps ({', '.join(map(str, dirs))})"
        except (ReduceError, StoreError) as e:
            source = f"no stored maps of corpus {corpus}: {e}"

    data = Path(out) / "data"
    tmp = data.with_name(data.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "heads").mkdir(parents=True)
    (tmp / "attributions").mkdir()
    values = atlas.drop(columns=[c for c in ID_COLUMNS if c in atlas]).to_dict("records")
    statistics_display = {
        c: {"label": f"{c}: {registry.describe(c).text()}", "format": "default"}
        for c in atlas.columns
        if c not in ID_COLUMNS
    }
    statistics_display["sequence_source"] = {"label": "sequences shown", "format": "default"}
    rows = []
    for i, (layer, head) in enumerate(zip(atlas["layer"].astype(int), atlas["head"].astype(int))):
        r = values[i]
        row = {"layer": int(layer), "head": int(head)}
        row.update({c: _number(r[c]) for c in metrics})
        row.update({k: _number(r[v]) for k, v in aliases.items()})
        rows.append(row)
        seqs = sequences[i]
        payload = {
            "sequences": seqs,
            "qk_distance_histogram": distance_histogram(seqs),
            "top_query_tokens": top_tokens(seqs, "query"),
            "top_key_tokens": top_tokens(seqs, "key"),
            "histogram": {},
            "statistics": {**{c: _plain(v) for c, v in r.items()}, "sequence_source": source},
        }
        (tmp / "heads" / f"L{layer}H{head}.json").write_text(json.dumps(payload, allow_nan=False))
    config = {
        "model_name": model,
        "heads": [[int(a), int(b)] for a, b in zip(atlas["layer"], atlas["head"])],
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_intervals": N_INTERVALS,
        "metrics": names,
        "metric_descriptions": desc,
        "head_data_pattern": "L{layer}H{head}.json",
        "has_umap": False,
        "umap_heads": [],
        "custom_plots": [{"key": "qk_distance_histogram", "label": "Q-K distance (stored top pairs)"}],
        "custom_tables": [
            {"key": "top_query_tokens", "label": "Top query tokens"},
            {"key": "top_key_tokens", "label": "Top key tokens"},
        ],
        "statistics_display": statistics_display,
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1, allow_nan=False))
    (tmp / "scatter_data.json").write_text(json.dumps(rows, allow_nan=False))
    (tmp / "server_config.json").write_text("{}")
    (tmp / "attributions" / "manifest.json").write_text("{}")
    old = data.with_name(data.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if data.exists():
        data.rename(old)
    tmp.rename(data)
    shutil.rmtree(old, ignore_errors=True)
    return data
