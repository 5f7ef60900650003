"""A quick look at one input and at a finished atlas (``headatlas look`` / ``headatlas atlas``).

The numbers ``look`` prints are the analyses' own: the input goes through the model as extraction runs it
(same tokenisation, special tokens and BOS) and its maps through Clark's surface reducer
(:class:`headatlas.clark.reducers.SurfaceReducer`) and behaviour labels
(:func:`headatlas.clark.surface.behaviour_table`), so they are the numbers of
``results/clark/{model}/{corpus}/behaviour.tsv`` for a corpus of this one input. A statistic a model kind
does not define (the next token for a decoder, [SEP] without one) is left out, never printed as 0.

- :func:`load_config`: a config file with its ``extends:`` bases merged under it (a missing file is named);
- :func:`look_spec`: a config model name, a local ``save_pretrained`` directory or a hub id -> ModelSpec;
- :func:`input_record` / :func:`tokenize_input`: the input as a record and as extraction tokenises it;
- :func:`sentence_maps`, :func:`surface_patterns`, :func:`strongest_heads`, :func:`maps_figure`;
- :func:`head_roles` / :func:`atlas_summary`: a finished ``results/atlas/{model}/atlas.tsv``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from .atlas import columns as registry
from .clark.reducers import SurfaceReducer
from .clark.surface import SurfaceSettings, behaviour_table
from .core.align import encode_record
from .core.batching import pad_token
from .core.config_checks import rule_model_dir
from .core.data import Record
from .core.figures import head_label, save_figure
from .core.inputs import check_yaml, config_bases, merge_config
from .core.io import flags, head_shape
from .core.models import ModelError, ModelSpec, decoder_bos, model_kind, position_limit
from .core.reduce import LayerMaps, fused_reduce

# Clark et al.'s surface statistics that look prints (clark/surface.py STATS), with what each measures
PATTERNS = {
    "prev": "attention to the previous token",
    "next": "attention to the next token (encoders only)",
    "self": "attention to the token itself",
    "cls": "attention to [CLS] (decoders: BOS)",
    "sep": "attention to [SEP]",
    "punct": "attention to . and ,",
    "entropy": "mean smoothed row entropy, nats (high = broad)",
}
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class LookError(ValueError):
    """Bad input to ``headatlas look`` / ``atlas`` (one line, printed as the error)."""


def quiet_libraries() -> None:
    """Keep the libraries' progress bars (transformers' weight loading, the hub's downloads) off the terminal:
    look prints its own lines only (warnings and errors still show)."""
    import huggingface_hub.utils
    import transformers.utils.logging as hf_logging

    hf_logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


def load_config(path: str | Path) -> dict:
    """A config file as Snakemake reads it with ``--configfile``: its ``extends:`` bases under it."""
    if not Path(path).is_file():
        raise LookError(f"config file {path} does not exist (give --config PATH, or --config '' for none)")
    cfg = merge_config(config_bases([path]), check_yaml(path))
    cfg.pop("extends", None)
    return cfg


def looks_like_path(model: str) -> bool:
    """Whether ``model`` names a local directory rather than a hub id (owner/name): it starts with / . or ~,
    has more than one slash, ends with one, or its first part is a local directory."""
    if model.startswith(("/", ".", "~")) or model.endswith("/") or model.count("/") > 1 or "\\" in model:
        return True
    return "/" in model and Path(model.split("/")[0]).is_dir()


def look_spec(
    model: str, config: dict | None = None, max_length: int = 512, bos_token: str = "auto"
) -> tuple[ModelSpec, str | None]:
    """(ModelSpec, directory a rule wrote it to or None) for a config model name, else a local
    directory, else a hub id. A derived config model inherits its base's settings; its directory
    must exist (run the workflow first), else ModelError says which target builds it. A path that
    does not exist is an error, never taken for a hub id."""
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
    path = Path(model).expanduser()
    if path.is_dir():
        name = path.resolve().name
        return ModelSpec(name=name, source={"path": str(path)}, max_length=max_length, bos_token=bos_token), None
    if looks_like_path(model) or path.exists():
        what = "is a file, not a model directory" if path.exists() else "does not exist"
        raise ModelError(f"local model directory {model} {what} (a save_pretrained directory with config.json)")
    if HUB_ID.fullmatch(model):
        name = model.replace("/", "--")
        return ModelSpec(name=name, source={"hub": model}, max_length=max_length, bos_token=bos_token), None
    known = ", ".join(sorted(entries)) or "none"
    raise ModelError(f"{model!r} is not a model of the config ({known}), a local directory, or a hub id (owner/name)")


def check_text(text: str, what: str) -> str:
    """``text`` if it is Unicode text; a LookError naming the first byte that is not UTF-8 (Python gives such
    bytes of a command line as lone surrogates, U+DC80..U+DCFF)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise LookError(
            f"the {what} is not UTF-8 text ({byte} at character {e.start + 1}): give it in UTF-8 (check the "
            "terminal's encoding, or convert it with iconv)"
        ) from None
    return text


def input_record(text: str, pair: str | None = None) -> Record:
    """The input (and second segment) as one record of whitespace-separated words; an empty input or one that is
    not UTF-8 text is a LookError."""
    a = check_text(text, "sentence").split()
    b = check_text(pair, "second sentence (--pair)").split() if pair else []
    if not a:
        raise LookError('the sentence is empty: give at least one word, e.g. headatlas look MODEL "the cat sat"')
    return Record(id="look", words=tuple(a + b), segment=(0,) * len(a) + (1,) * len(b))


def tokenize_input(record: Record, tokenizer, config, spec: ModelSpec):
    """(TokenizedRecord, model kind, note): the record tokenised exactly as extraction does (overflow
    'truncate': the longest word prefix that fits ``max_length``, or the model's position limit when that is
    lower); the note says when it was cut. A first word that alone does not fit is a LookError."""
    kind = model_kind(config, spec)
    n, why = spec.max_length, "max_length"
    limit = position_limit(config.to_dict())
    if limit is not None and limit[1] < n:
        n, why = limit[1], f"its position limit, {limit[0]} in config.json"
    tok = encode_record(record, tokenizer, kind, n, "truncate", decoder_bos(tokenizer, config, spec))
    if tok is None:
        first = record.words[0]
        raise LookError(
            f"the first word alone ({len(first):,} characters, {first[:20]!r}...) is longer than the {n} tokens "
            f"{spec.name} takes ({why}): split it into shorter words"
        )
    note = ""
    if tok.truncated:
        note = (
            f"the input is cut to its first {tok.n_words} of {len(record.words)} words: {spec.name} takes at most "
            f"{n} tokens ({why})"
        )
    return tok, kind, note


def sentence_maps(model, tokenizer, config, spec: ModelSpec, tok, kind: str) -> np.ndarray:
    """The [L, H, n, n] float32 maps of one tokenised input (extraction's forward pass)."""
    maps: dict = {}
    pad = pad_token(tokenizer)
    keep = LayerMaps(lambda layer, attn, batch: maps.__setitem__(layer, attn[0].float().cpu().numpy()))
    fused_reduce(model, [tok], [keep], 1, kind, pad_id=pad, name=spec.name, corpus="look", path="eager")
    return np.stack([maps[layer] for layer in sorted(maps)]).astype(np.float32)


def surface_settings(config: dict | None):
    """Clark's surface settings of the config (analysis.clark_surface), defaults where it has none."""
    return SurfaceSettings.pick(((config or {}).get("analysis") or {}).get("clark_surface") or {})


def surface_patterns(model, tokenizer, spec: ModelSpec, tok, kind: str, settings) -> pd.DataFrame:
    """Clark's per-head surface statistics and behaviour label of one tokenised input: the analysis's
    reducer fed by the model's forward pass (:func:`headatlas.core.reduce.fused_reduce`, as a fused
    extraction runs it), then its labels: the columns of ``behaviour.tsv``. Undefined statistics are NaN."""
    pad = pad_token(tokenizer)
    reducer = SurfaceReducer.from_settings(settings)
    (table,) = fused_reduce(
        model, [tok], [reducer], 1, kind, pad_id=pad, name=spec.name, corpus="look", record_id=["look"]
    )
    out = behaviour_table(table, settings)
    out.insert(4, "head_label", [head_label(a, b) for a, b in zip(out["layer"], out["head"])])
    return out


def strongest_heads(scores: pd.DataFrame, k: int = 3) -> dict[str, list[tuple[str, float]]]:
    """Per pattern, the k heads with the highest value (label, value); patterns undefined for this input or
    model kind (all NaN) are left out."""
    out = {}
    for p in PATTERNS:
        if p not in scores:
            continue
        col = scores[p].dropna()
        if len(col):
            top = scores.loc[col.sort_values(ascending=False, kind="stable").index[:k]]
            out[p] = [(r.head_label, float(getattr(r, p))) for r in top.itertuples()]
    return out


def maps_figure(maps: np.ndarray, pieces, title: str, png, svg) -> None:
    """Every head's map in a layers x heads grid: layer 1 at the top, head 1 at the left;
    in each panel rows are queries and columns keys, colour = attention weight in [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


# --- a finished atlas ---------------------------------------------------------------------------------------


def head_roles(atlas: pd.DataFrame, margin: float = 0.05) -> pd.Series:
    """Per head of an atlas table, its roles as one string: Clark's behaviour label, the Pande roles
    significant after FDR, the relation it predicts best when it beats that relation's best offset
    baseline by ``margin`` (accuracy as a fraction), the detectors significant after FDR and the sink
    flag; indexed by the 1-based head label."""
    parts = []
    pande = sorted(c[len("pande_") : -len("_sig_fdr")] for c in atlas.columns if c.endswith("_sig_fdr"))
    dets = [c[len("det_") : -len("_sig")] for c in atlas.columns if c.startswith("det_") and c.endswith("_sig")]
    for r in atlas.to_dict("records"):
        roles = []
        beh = r.get("clark_behaviour")
        if isinstance(beh, str) and beh not in ("", "none", "other"):
            roles.append(f"clark:{beh}")
        sig = [p for p in pande if flags(r.get(f"pande_{p}_sig_fdr"))]
        if sig:
            roles.append("pande:" + ",".join(sig))
        rel, m = r.get("syntax_best_relation"), r.get("syntax_best_margin")
        if isinstance(rel, str) and m is not None and m == m and m >= margin:
            roles.append(f"syntax:{rel}(+{m:.2f})")
        det = [d for d in dets if flags(r.get(f"det_{d}_sig"))]
        if det:
            roles.append("det:" + ",".join(det))
        if flags(r.get("det_sink_head")):
            roles.append("sink")
        parts.append(" ".join(roles) or "-")
    labels = [head_label(la, h) for la, h in zip(atlas["layer"], atlas["head"])]
    return pd.Series(parts, index=labels, name="roles")


def _top(atlas: pd.DataFrame, col: str, k: int, kinds: str | None, lowest: bool = False) -> str:
    """The k heads with the largest (``lowest``: smallest) value of ``col`` (label value), values whose kind
    is not an effect left out."""
    v = atlas[col].astype(float)
    if kinds:
        v = v.where(atlas[kinds].map(lambda x: registry.is_effect(None if pd.isna(x) else str(x))))
    v = v.dropna()
    if not len(v):
        return "no value"
    top = v.sort_values(ascending=lowest, kind="stable").index[:k]
    return ", ".join(f"{head_label(atlas['layer'][i], atlas['head'][i])} {v[i]:.3g}" for i in top)


def atlas_summary(atlas: pd.DataFrame, k: int = 3) -> dict:
    """A finished atlas by family: heads, layers x heads, heads with a role; heads per Clark behaviour,
    per Pande role (FDR), per best relation beating its baseline; Jo & Myaeng's best heads per category;
    per detector the heads significant after FDR and the strongest; sink heads; per ablation effect
    the heads whose ablation costs most and how the values were obtained. Keys name the family
    (:data:`headatlas.atlas.columns.FAMILIES`); values are text or {label: count}."""
    atlas = atlas.reset_index(drop=True)
    roles = head_roles(atlas)
    out = {
        "heads": len(atlas),
        "layers x heads": "{} x {}".format(*head_shape(atlas)),
        "heads with a role": int((roles != "-").sum()),
    }
    fam = registry.FAMILIES
    if "clark_behaviour" in atlas:
        out[f"{fam['clark']}: heads per behaviour"] = atlas["clark_behaviour"].fillna("-").value_counts().to_dict()
    pande = {
        c[len("pande_") : -len("_sig_fdr")]: int(flags(atlas[c]).sum()) for c in atlas.columns if c.endswith("_sig_fdr")
    }
    if pande:
        out[f"{fam['pande']}: heads per role (FDR)"] = dict(sorted(pande.items(), key=lambda kv: (-kv[1], kv[0])))
    rel = roles.str.extractall(r"syntax:([^(]+)\(")[0]
    if len(rel):
        out[f"{fam['syntax']}: best relation beating its baseline"] = rel.value_counts().to_dict()
    for c in [c for c in atlas.columns if c.startswith("probe_") and c.endswith("_mean_acc")]:
        out[f"{fam['probe']}: {c} ({registry.describe(c).unit})"] = _top(atlas, c, k, None)
    for c in [c for c in atlas.columns if c.startswith("det_") and c + "_sig" in atlas]:
        n_sig = int(flags(atlas[c + "_sig"]).sum())
        out[f"{fam['det']}: {c} ({registry.describe(c).unit})"] = (
            f"{n_sig} significant (FDR); top {_top(atlas, c, k, None)}"
        )
    if "det_sink_head" in atlas:
        out[f"{fam['det']}: sink heads"] = int(flags(atlas["det_sink_head"]).sum())
    for c in [c for c in atlas.columns if c.startswith("ablation_") and c.endswith("_effect")]:
        kinds = registry.kind_column(c, atlas.columns)
        how = kinds or (c[: -len("_effect")] + "_method" if c[: -len("_effect")] + "_method" in atlas else None)
        counts = atlas[how].fillna("-").map(lambda s: str(s).split(":")[0]).value_counts().to_dict() if how else {}
        # the heads whose ablation costs most: loss up (largest effect), accuracy down (smallest)
        text = f"top {_top(atlas, c, k, kinds, lowest='_accuracy_' in c)}" + (
            f"; {', '.join(f'{a} {b}' for a, b in counts.items())}" if counts else ""
        )
        out[f"{fam['ablation']}: {c} ({registry.describe(c).unit})"] = text
    return out
