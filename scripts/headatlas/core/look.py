"""A quick look at one input: every head's map, the strongest heads per surface pattern, and
each head's roles from a finished atlas (``headatlas look`` / ``headatlas atlas``).

- :func:`load_config`: a config file with its ``extends:`` bases merged under it;
- :func:`look_spec`: a config model name, a local ``save_pretrained`` directory or a hub id -> ModelSpec;
- :func:`sentence_maps`: the [L, H, n, n] maps and the tokens of one sentence (or pair);
- :func:`pattern_scores` / :func:`strongest_heads`: per-head surface patterns of those maps;
- :func:`maps_figure`: a layers x heads grid of the maps (layer 1 at the top, head 1 at the left);
- :func:`head_roles` / :func:`atlas_summary`: the roles each head has in ``results/atlas/{model}/atlas.tsv``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_EOS, SPECIAL_SEP, Record
from .figures import head_label
from .inputs import config_bases, merge_config
from .models import ModelError, ModelSpec

DERIVED_DIRS = {"gguf": "gguf", "finetuned": "finetuned", "random_init": "random_init"}
# the surface patterns scored per head (Clark et al. 2019, Fig. 2), with what each measures
PATTERNS = {
    "prev": "attention to the previous token",
    "next": "attention to the next token",
    "self": "attention to the token itself",
    "first": "attention to the first token ([CLS] / BOS)",
    "sep": "attention to [SEP] / EOS",
    "punct": "attention to . and ,",
    "broad": "mean row entropy (nats; high = broad)",
}


def load_config(path: str | Path) -> dict:
    """A config file as Snakemake reads it with ``--configfile``: its ``extends:`` bases under it."""
    from .inputs import check_yaml

    cfg = merge_config(config_bases([path]), check_yaml(path))
    cfg.pop("extends", None)
    return cfg


def rule_model_dir(name: str, source: dict) -> str | None:
    """The directory a workflow rule writes a model to (GGUF, fine-tuned, random-init), else None."""
    kind = next((k for k in DERIVED_DIRS if k in source), None)
    return f"results/models/{DERIVED_DIRS[kind]}/{name}" if kind else None


def look_spec(
    model: str, config: dict | None = None, max_length: int = 512, bos_token: str = "auto"
) -> tuple[ModelSpec, str | None]:
    """(ModelSpec, directory a rule wrote it to or None) for a config model name, else a local
    directory, else a hub id. A derived config model inherits its base's settings; its directory
    must exist (run the workflow first), else ModelError says which target builds it."""
    entries = {m["name"]: m for m in (config or {}).get("models", [])}
    if model in entries:
        entry = dict(entries[model])
        for kind in ("finetuned", "random_init"):
            if kind in entry["source"]:
                base = entries.get(entry["source"][kind]["base"], {})
                entry = {**{k: v for k, v in base.items() if k not in ("name", "source", "corpora")}, **entry}
        entry.pop("corpora", None)
        d = rule_model_dir(model, entry["source"])
        if d and not Path(d, "config.json").is_file():
            raise ModelError(
                f"model {model!r} is built by the workflow into {d}, which does not exist yet: "
                f"run `snakemake --cores 2 {d}` (or the whole workflow) first"
            )
        return ModelSpec.from_config(entry), d
    if Path(model).is_dir():
        name = Path(model).resolve().name
        return ModelSpec(name=name, source={"path": str(model)}, max_length=max_length, bos_token=bos_token), None
    if "/" in model and not Path(model).exists():
        name = model.replace("/", "--")
        return ModelSpec(name=name, source={"hub": model}, max_length=max_length, bos_token=bos_token), None
    known = ", ".join(sorted(entries)) or "none"
    raise ModelError(f"{model!r} is not a model of the config ({known}), a local directory, or a hub id (owner/name)")


def sentence_maps(model, tokenizer, config, spec: ModelSpec, text: str, pair: str | None = None):
    """(maps [L, H, n, n] float32, TokenizedRecord) of one whitespace-tokenised sentence (or pair),
    tokenised exactly as extraction does (same special tokens, same BOS)."""
    from .align import encode_record
    from .extract import forward_batches, model_shape
    from .models import decoder_bos, model_kind

    words = text.split() + (pair.split() if pair else [])
    if not words:
        raise ValueError("an empty sentence: give at least one word")
    segment = (0,) * len(text.split()) + (1,) * (len(words) - len(text.split()))
    record = Record(id="look", words=tuple(words), segment=segment)
    kind = model_kind(config, spec)
    tok = encode_record(record, tokenizer, kind, spec.max_length, "truncate", decoder_bos(tokenizer, config, spec))
    n_layers, n_heads = model_shape(config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ((_, maps, _),) = forward_batches(model, [tok], 1, n_layers, n_heads, spec.name, pad, kind=kind)
    return np.stack([m[0] for m in maps]).astype(np.float32), tok


def pattern_scores(maps: np.ndarray, special, pieces) -> pd.DataFrame:
    """One row per head (layer, head 0-based, label 1-based) with the mean of each of
    :data:`PATTERNS` over the query rows of ``maps`` [L, H, n, n]."""
    L, H, n, _ = maps.shape
    special = np.asarray(special)
    rows = np.arange(n)
    out = {"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L)}
    flat = maps.reshape(L * H, n, n)
    nan = np.full(L * H, np.nan)
    out["prev"] = flat[:, rows[1:], rows[1:] - 1].mean(axis=1) if n > 1 else nan
    out["next"] = flat[:, rows[:-1], rows[:-1] + 1].mean(axis=1) if n > 1 else nan
    out["self"] = flat[:, rows, rows].mean(axis=1)
    first = special[0] in (SPECIAL_CLS, SPECIAL_BOS)
    out["first"] = flat[:, :, 0].mean(axis=1) if first else nan
    sep = np.isin(special, [SPECIAL_SEP, SPECIAL_EOS])
    out["sep"] = flat[:, :, sep].sum(axis=2).mean(axis=1) if sep.any() else nan
    punct = np.array([p.lstrip("Ġ▁#") in (".", ",") for p in pieces])
    out["punct"] = flat[:, :, punct].sum(axis=2).mean(axis=1) if punct.any() else nan
    out["broad"] = -(flat * np.log(np.clip(flat, 1e-12, None))).sum(axis=2).mean(axis=1)
    df = pd.DataFrame(out)
    df.insert(2, "label", [head_label(la, h) for la, h in zip(df["layer"], df["head"])])
    return df


def strongest_heads(scores: pd.DataFrame, k: int = 3) -> dict[str, list[tuple[str, float]]]:
    """Per pattern, the k heads with the highest mean (label, value); patterns absent from the input are left out."""
    out = {}
    for p in PATTERNS:
        col = scores[p].dropna()
        if len(col):
            top = scores.loc[col.sort_values(ascending=False, kind="stable").index[:k]]
            out[p] = [(r.label, float(getattr(r, p))) for r in top.itertuples()]
    return out


def maps_figure(maps: np.ndarray, pieces, title: str, png, svg) -> None:
    """Every head's map in a layers x heads grid: layer 1 at the top, head 1 at the left;
    in each panel rows are queries and columns keys, colour = attention weight in [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .figures import save_figure

    L, H, n, _ = maps.shape
    size = 1.1 if H * L <= 150 else 0.7
    fig, axes = plt.subplots(L, H, figsize=(H * size + 1.5, L * size + 1.2), squeeze=False)
    for la in range(L):
        for h in range(H):
            ax = axes[la, h]
            im = ax.imshow(maps[la, h], cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                ax.set_ylabel(f"layer {la + 1}", fontsize=6)
            if la == 0:
                ax.set_title(f"head {h + 1}", fontsize=6)
    shown = " ".join(pieces) if len(pieces) <= 40 else " ".join(pieces[:40]) + " ..."
    fig.suptitle(f"{title}\nrows = query tokens, columns = key tokens: {shown}", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.3, label="attention weight (fraction of the row, 0-1)")
    save_figure(fig, png, svg)


def head_roles(atlas: pd.DataFrame, margin: float = 0.05) -> pd.Series:
    """Per head of an atlas table, its roles as one string: Clark's behaviour label, the Pande roles
    significant after FDR, and the relation it predicts best when it beats that relation's best
    offset baseline by ``margin`` (accuracy as a fraction); indexed by the 1-based head label."""
    parts = []
    pande = sorted(c[len("pande_") : -len("_sig_fdr")] for c in atlas.columns if c.endswith("_sig_fdr"))
    for r in atlas.to_dict("records"):
        roles = []
        beh = r.get("clark_behaviour")
        if isinstance(beh, str) and beh not in ("", "none", "other"):
            roles.append(f"clark:{beh}")
        sig = [p for p in pande if r.get(f"pande_{p}_sig_fdr") is True or r.get(f"pande_{p}_sig_fdr") == 1]
        if sig:
            roles.append("pande:" + ",".join(sig))
        rel, m = r.get("syntax_best_relation"), r.get("syntax_best_margin")
        if isinstance(rel, str) and m is not None and m == m and m >= margin:
            roles.append(f"syntax:{rel}(+{m:.2f})")
        parts.append(" ".join(roles) or "-")
    labels = [head_label(la, h) for la, h in zip(atlas["layer"], atlas["head"])]
    return pd.Series(parts, index=labels, name="roles")


def atlas_summary(atlas: pd.DataFrame) -> dict:
    """Counts of a finished atlas: heads, layers x heads, heads per Clark behaviour, per Pande
    role (FDR), and per best relation beating its baseline."""
    roles = head_roles(atlas)
    out = {
        "heads": len(atlas),
        "layers x heads": f"{atlas['layer'].max() + 1} x {atlas['head'].max() + 1}",
        "heads with a role": int((roles != "-").sum()),
    }
    if "clark_behaviour" in atlas:
        out["clark behaviour"] = atlas["clark_behaviour"].fillna("-").value_counts().to_dict()
    pande = {
        c[len("pande_") : -len("_sig_fdr")]: int(atlas[c].fillna(False).astype(bool).sum())
        for c in atlas.columns
        if c.endswith("_sig_fdr")
    }
    if pande:
        out["pande roles (FDR)"] = dict(sorted(pande.items(), key=lambda kv: (-kv[1], kv[0])))
    rel = roles.str.extractall(r"syntax:([^(]+)\(")[0]
    if len(rel):
        out["best relation beating its baseline"] = rel.value_counts().to_dict()
    return out
