"""The interactive atlas page: one self-contained HTML file for every model of a run.

The page (``results/atlas/index.html``, rule ``atlas_page``) embeds, as one JSON object:

- per model, every column of its ``atlas.tsv`` (generic: any numeric or true/false column can
  colour the grid, so columns added by later analyses appear without a change here), with its
  description and unit from the column registry (:mod:`headatlas.atlas.columns`), its CI where the
  atlas has CI columns beside it, and how each value was obtained where it has a ``<column>_kind``
  column (unreliable and skipped values are never coloured as effects; estimates are drawn hatched);
- the model's method agreement (``agreement.tsv``);
- a handful of real example sentences with every head's word-level attention map (Clark's
  aggregation, :func:`headatlas.core.store.word_level`), read through the public store API from
  a small pool of sequences that have stored maps (a ``maps: sample`` corpus: its ``sample/``
  stores; a store without maps gives none: the page says so), and per head the sentence of that
  pool where the head is *most typical of its role* (:func:`typical_sentences`).

The embedded JSON escapes ``<``, ``>`` and ``&`` (as ``\\u003c`` ...), so no corpus text can end or
comment out its script block.

The JavaScript and CSS (``page.js``, ``page.css`` beside this file) are inlined; the file needs
no server and no network.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_NAMES, SPECIAL_NONE, read_records
from ..core.figures import head_label
from ..core.io import atomic_path, flags, head_shape
from ..core.reduce import map_dirs
from ..core.reducer import ReduceError
from ..core.settings import Settings
from ..core.store import AttentionStore, StoreError, word_level
from . import columns as registry

HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)
ID_COLUMNS = ("model", "layer", "head", "label")
ROLE_COLUMN = re.compile(r"^(?P<role>.+)_sig_(?P<mode>faithful|fdr)$")
KV_COLUMN = "det_kv_group"  # detectors: the key/value head a query head reads


@dataclass(frozen=True, kw_only=True)
class PageSettings(Settings):
    """analysis.atlas.page (workflow/schemas/atlas.schema.yaml)."""

    SECTION = "analysis.atlas.page"

    corpus: str = "ewt_dev"  # the corpus whose stored maps give the example sentences
    examples: int = 3  # sentences shown for every head (plus its typical one)
    pool: int = 24  # sentences with stored maps read per model; the typical one is chosen among them
    min_words: int = 5
    max_words: int = 18
    probe: int = 400  # at most this many sequences tried when a store keeps maps of a sample only


# --- columns ---------------------------------------------------------------------------


def _is_bool(s: pd.Series) -> bool:
    if s.dtype == bool:
        return True
    vals = set(s.dropna().map(str))
    return bool(vals) and vals <= {"True", "False"}


def column_kind(s: pd.Series) -> str:
    """'bool', 'number' or 'text'."""
    if _is_bool(s):
        return "bool"
    return "number" if pd.api.types.is_numeric_dtype(s) else "text"


def _values(s: pd.Series, kind: str) -> list:
    """JSON-ready values: None for a missing value."""
    if kind == "bool":
        return flags(s, na=None).to_numpy(object, na_value=None).tolist()
    if kind == "number":
        a = s.to_numpy(float)
        return [float(v) if np.isfinite(v) else None for v in a]
    return [None if pd.isna(v) else str(v) for v in s]


def column_data(atlas: pd.DataFrame) -> tuple[list[dict], dict[str, list]]:
    """Every atlas column (but the head's identity) as (columns, values): each column has its
    name, kind (bool, number, text), description, unit and family (:mod:`headatlas.atlas.columns`)
    and, when the atlas has them, its CI columns (``ci``: :func:`~headatlas.atlas.columns.ci_columns`)
    and the column saying how each value was obtained (``kinds``: ``<name>_kind``); a CI or kind
    column names the column it belongs to (``ci_of``, ``kinds_of``)."""
    names = [c for c in atlas.columns if c not in ID_COLUMNS]
    cis = {c: pair for c in names if (pair := registry.ci_columns(c, names))}
    ci_of = {v: c for c, pair in cis.items() for v in pair}
    kinds = {c: k for c in names if (k := registry.kind_column(c, names))}
    kinds_of = {k: c for c, k in kinds.items()}
    columns, values = [], {}
    for c in names:
        kind = column_kind(atlas[c])
        doc = registry.describe(c)
        col = {"name": c, "kind": kind, "desc": doc.desc, "unit": doc.unit, "family": doc.family}
        if c in cis:
            col["ci"] = list(cis[c])
        if c in ci_of:
            col["ci_of"] = ci_of[c]
        if c in kinds:
            col["kinds"] = kinds[c]
        if c in kinds_of:
            col["kinds_of"] = kinds_of[c]
        columns.append(col)
        values[c] = _values(atlas[c], kind)
    return columns, values


def kv_shared(atlas: pd.DataFrame) -> bool:
    """Whether query heads of this atlas share key/value heads (fewer ``det_kv_group`` values than
    heads in a layer): only then is a KV-group filter meaningful (an encoder has one group per head)."""
    if KV_COLUMN not in atlas or atlas[KV_COLUMN].isna().all():
        return False
    per_layer = atlas.groupby("layer")[KV_COLUMN].nunique()
    return bool((per_layer < atlas.groupby("layer")["head"].nunique()).any())


def role_columns(columns: list[dict]) -> list[dict]:
    """The roles the page filters on: every true/false column ``<role>_sig_<faithful|fdr>``."""
    roles: dict[str, dict] = {}
    for c in columns:
        m = ROLE_COLUMN.match(c["name"])
        if m and c["kind"] == "bool":
            roles.setdefault(m["role"], {"role": m["role"]})[m["mode"]] = c["name"]
    return list(roles.values())


def rank_desc(values: np.ndarray) -> np.ndarray:
    """Rank of every value, 1 = highest, ties share the best rank; NaN where missing (what the
    page prints as a head's rank on the chosen column)."""
    values = np.asarray(values, dtype=float)
    out = np.full(len(values), np.nan)
    ok = np.isfinite(values)
    v = values[ok]
    out[ok] = 1 + np.searchsorted(np.sort(-v), -v, side="left")
    return out


# --- example sentences -------------------------------------------------------------------


def map_sequences(
    store: AttentionStore, eligible: np.ndarray, want: int, probe: int
) -> tuple[list[int], str, list[tuple[str, str]]]:
    """Up to ``want`` of the ``eligible`` sequences whose maps the store holds and reads back intact
    (every layer), a note saying why there are none, and the sequences left out because their maps
    are damaged, as (record id, the store's error). A store whose manifest says it holds no maps gives
    none; any other store is probed sequence by sequence, at most ``probe`` tries. (A ``maps: sample``
    corpus is read through its ``sample/`` stores: :func:`examples_data`.)"""
    if not all(m.get("maps", True) for m in store.manifests):  # what is on disk, not the meta's claim
        return [], f"the store of {store.meta.get('corpus', '?')} keeps no maps (maps: false)", []
    found: list[int] = []
    damaged: list[tuple[str, str]] = []
    for k in eligible[:probe]:
        try:
            for layer in range(store.n_layers):
                store.maps(layer, int(k))
        except (StoreError, KeyError, IndexError) as e:
            if "no maps stored" in str(e):  # a store written without maps (no manifest says so): none, not damage
                return [], f"the store of {store.meta.get('corpus', '?')} keeps no maps", []
            damaged.append((str(store.record_id[int(k)]), str(e)))
            continue
        found.append(int(k))
        if len(found) == want:
            break
    if found:
        return found, "", damaged
    if not len(eligible):
        return [], "no sentence of the configured length in the store", damaged
    return [], f"no readable maps among the {min(probe, len(eligible))} sentences tried", damaged


def unit_labels(words: tuple[str, ...], unit_word: np.ndarray, unit_special: np.ndarray) -> list[str]:
    """Readable labels of word-level units: the word, or [CLS], [SEP], [BOS]... for specials."""
    return [
        words[w] if s == SPECIAL_NONE and 0 <= w < len(words) else f"[{SPECIAL_NAMES.get(int(s), 'tok').upper()}]"
        for w, s in zip(unit_word.tolist(), unit_special.tolist())
    ]


def encode_map(m: np.ndarray) -> str:
    """A [U, U] map as base64 of uint8 (value x 255, rounded), row-major (rows = from)."""
    q = np.clip(np.rint(np.asarray(m, dtype=np.float64) * 255), 0, 255).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii")


def decode_map(s: str, n: int) -> np.ndarray:
    """Inverse of :func:`encode_map` (values to 1/255)."""
    return np.frombuffer(base64.b64decode(s), dtype=np.uint8).reshape(n, n) / 255.0


def head_roles(atlas: pd.DataFrame, roles: list[str]) -> list[list[tuple[str, bool]]]:
    """Per atlas row, the head's candidate roles in order, as (role, held): the Pande roles it
    holds under FDR by decreasing effect, then the others by decreasing effect (roles without an
    effect are left out). The first candidate that has a sentence score is the head's role for
    :func:`typical_sentences`: the held role with the largest effect, or, for a head that holds
    none, its largest-effect role (held = False)."""
    have = [r for r in roles if f"pande_{r}_effect" in atlas]
    if not have:
        return [[] for _ in range(len(atlas))]
    eff = np.stack([atlas[f"pande_{r}_effect"].to_numpy(float) for r in have], axis=1)
    sig = np.stack(
        [
            flags(atlas[f"pande_{r}_sig_fdr"]) if f"pande_{r}_sig_fdr" in atlas else np.zeros(len(atlas), bool)
            for r in have
        ],
        axis=1,
    )
    key = np.where(np.isfinite(eff), eff, -np.inf)
    order = np.lexsort((-key, ~sig), axis=1)  # held first, then by decreasing effect
    return [[(have[j], bool(sig[i, j])) for j in order[i] if np.isfinite(eff[i, j])] for i in range(len(atlas))]


def typical_sentences(scores: np.ndarray, roles: list[str], candidates: list[list[tuple[str, bool]]]) -> list[dict]:
    """Per head (layer-major), the pool sentence where it is most typical of its role: the one
    with the highest Pande sentence score (attention on the role's sieve keys relative to
    uniform, 1 = uniform) for its first candidate role (:func:`head_roles`) that has a score on
    some pool sentence (a role can have none, e.g. block on a corpus without sentence pairs).
    ``scores`` [P, L, H, R] are the pool's sentence scores. Returns dicts (role, held, pool
    index ``s``, score), or None where no candidate has a score."""
    P, L, H, _ = scores.shape
    out = []
    for i, cands in enumerate(candidates):
        pick = None
        for role, held in cands:
            if role not in roles or P == 0:
                continue
            col = scores[:, i // H, i % H, roles.index(role)]
            if np.isfinite(col).any():
                s = int(np.nanargmax(col))
                pick = {"role": role, "held": held, "s": s, "score": round(float(col[s]), 4)}
                break
        out.append(pick)
    return out


def read_scores(path: str | Path, record_ids: np.ndarray, pool: list[int]) -> tuple[np.ndarray, list[str]]:
    """Pande's sentence scores [P, L, H, R] of the pool sequences (positions in a store whose record
    ids are ``record_ids``: the corpus's store, or its ``sample/`` store) and the role names, from
    ``results/pande/{model}/scores/{corpus}.h5``, found by record id; a pool sequence the file does
    not score is an error (the file scores other sequences: rerun pande_scores)."""
    import h5py

    with h5py.File(path, "r") as f:
        ids = f["record_id"].asstr()[()]
        roles = [r.decode() if isinstance(r, bytes) else str(r) for r in f["roles"][()]]
        where = {r: i for i, r in enumerate(ids)}
        want = [str(r) for r in np.asarray(record_ids)[pool]] if pool else []
        missing = [r for r in want if r not in where]
        if missing:
            raise ValueError(
                f"{path}: scores sequences differ from the store's (record {missing[0]} is not scored; rerun pande_scores)"
            )
        rows = [where[r] for r in want]
        order = np.argsort(rows)
        got = f["scores"][sorted(rows)] if rows else np.zeros((0,) + f["scores"].shape[1:], np.float32)
    out = np.empty_like(np.asarray(got))
    out[order] = got  # h5py reads increasing rows; back to pool order
    return out, roles


def examples_data(
    store_dirs: list[str] | None,
    corpus_path: str | None,
    scores_path: str | None,
    atlas: pd.DataFrame,
    settings: PageSettings,
) -> dict:
    """The example sentences of one model: ``sentences`` (record id, unit labels), per head
    (layer-major) its maps (``maps``: list of {s, m}) and its ``typical`` sentence, a ``note`` saying
    why there are fewer or none, and ``dropped``: the record ids left out because their maps are
    damaged (logged as a warning)."""
    out = {"corpus": settings.corpus, "sentences": [], "maps": [], "typical": [], "note": "", "dropped": []}
    if not store_dirs:
        out["note"] = f"corpus {settings.corpus} is not extracted for this model"
        return out

    try:  # a maps: sample corpus keeps its maps in its sample/ stores
        store_dirs = map_dirs(store_dirs, "the atlas page's example maps")
    except ReduceError:
        with AttentionStore(store_dirs) as store:
            out["note"] = f"the store of {store.meta.get('corpus', '?')} keeps no maps (maps: none)"
            out["maps"] = [[] for _ in range(store.n_layers * store.n_heads)]
            out["typical"] = [None] * (store.n_layers * store.n_heads)
        return out
    with AttentionStore(store_dirs) as store:
        L, H = store.n_layers, store.n_heads
        eligible = np.flatnonzero((store.n_words >= settings.min_words) & (store.n_words <= settings.max_words))
        pool, note, damaged = map_sequences(store, eligible, settings.pool, settings.probe)
        out["note"] = note
        if damaged:  # never silently: the log names the store and the records, the page shows the count
            ids = [r for r, _ in damaged]
            log.warning(
                "atlas page: %d example sentence(s) of %s left out, their stored maps are damaged: records %s "
                "(first error: %s)",
                len(ids),
                ", ".join(map(str, store_dirs)),
                ", ".join(ids),
                damaged[0][1],
            )
            out["dropped"] = ids
        if not pool:
            out["maps"] = [[] for _ in range(L * H)]
            out["typical"] = [None] * (L * H)
            return out
        need = sorted(store.record_index[pool].tolist())
        words, need_set = {}, set(need)
        if corpus_path:
            for i, r in enumerate(read_records(corpus_path)):
                if i in need_set:
                    words[i] = r.words
                if i >= need[-1]:
                    break
        typical: list = [None] * (L * H)
        if scores_path:
            scores, roles = read_scores(scores_path, store.record_id, pool)
            typical = typical_sentences(scores, roles, head_roles(atlas.sort_values(["layer", "head"]), roles))
        else:
            out["note"] = (out["note"] + "; " if out["note"] else "") + "no Pande sentence scores for this corpus"
        shown = list(range(min(settings.examples, len(pool))))
        wanted = [sorted(set(shown) | ({t["s"]} if t else set())) for t in typical]
        used = sorted(set(shown).union(*[set(w) for w in wanted]))
        index = {s: i for i, s in enumerate(used)}  # pool index -> sentence index on the page
        maps: list[list[dict]] = [[] for _ in range(L * H)]
        for s in used:
            k = pool[s]
            t = store.tokens(k)
            labels = None
            for layer in range(L):
                wm, unit_word, unit_special = word_level(store.maps(layer, k), t["word"], t["special"])
                if labels is None:
                    rec_words = words.get(int(store.record_index[k]), ())
                    labels = unit_labels(rec_words, unit_word, unit_special)
                for h in range(H):
                    i = layer * H + h
                    if s in wanted[i]:
                        maps[i].append({"s": index[s], "m": encode_map(wm[h])})
            out["sentences"].append({"record_id": str(store.record_id[k]), "units": labels})
        for t in typical:
            if t is not None:
                t["s"] = index[t["s"]]
        out["maps"], out["typical"] = maps, typical
        out["shown"] = [index[s] for s in shown]
        out["causal"] = store.meta.get("model_kind") == "decoder"
    return out


# --- the page ----------------------------------------------------------------------------


def model_data(
    model: str,
    atlas: pd.DataFrame,
    agreement: pd.DataFrame | None,
    examples: dict | None = None,
) -> dict:
    """Everything the page shows of one model (rows of ``atlas`` in layer-major order)."""
    atlas = atlas.sort_values(["layer", "head"]).reset_index(drop=True)
    n_layers, n_heads = head_shape(atlas)
    if len(atlas) != n_layers * n_heads:
        raise ValueError(f"atlas of {model}: {len(atlas)} rows, not one per head of {n_layers} x {n_heads}")
    columns, values = column_data(atlas)
    agr = []
    if agreement is not None and len(agreement):
        for r in agreement.to_dict("records"):
            agr.append({k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()})
    return {
        "model": model,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "labels": [head_label(a, b) for a, b in zip(atlas["layer"], atlas["head"])],
        "columns": columns,
        "values": values,
        "roles": role_columns(columns),
        "kv_shared": kv_shared(atlas),
        "agreement": agr,
        "examples": examples or {"sentences": [], "maps": [], "typical": [], "note": "no examples"},
    }


TYPICAL_DEFINITION = (
    "A head's role is the Pande role it holds under FDR with the largest effect among those scored on these "
    "sentences (block needs sentence pairs); a head holding none gets its largest-effect role, marked not held. "
    "Its typical sentence is the one of the sampled sentences with stored maps where its Pande sentence score for "
    "that role (attention on the role's keys relative to uniform attention, 1 = uniform) is highest."
)


def page_data(models: list[dict], settings: PageSettings, title: str = "headatlas: head atlas") -> dict:
    default = None
    for cand in ("pande_syntactic_effect", "syntax_all_accuracy", "clark_entropy"):
        if models and any(c["name"] == cand for c in models[0]["columns"]):
            default = cand
            break
    return {
        "title": title,
        "models": models,
        "default_column": default,
        "corpus": settings.corpus,
        "typical_definition": TYPICAL_DEFINITION,
    }


def render_page(data: dict) -> str:
    """The self-contained HTML page: data as JSON, the page's CSS and JS inlined."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    css = (HERE / "page.css").read_text(encoding="utf-8")
    js = (HERE / "page.js").read_text(encoding="utf-8")
    title = html.escape(str(data.get("title", "head atlas")))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
        f"<style>\n{css}\n</style>\n</head>\n<body>\n"
        f'<script type="application/json" id="atlas-data">{payload}</script>\n'
        f"<script>\n{js}\n</script>\n</body>\n</html>\n"
    )


def read_embedded(html: str) -> dict:
    """The data object embedded in a page (for tests and tools)."""
    m = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S)
    if not m:
        raise ValueError("no embedded atlas data in the page")
    return json.loads(m.group(1))


def build_page(sources: dict[str, dict], corpus_path: str | None, settings: PageSettings, out) -> tuple[str, dict]:
    """Read every model's tables (and example maps) named in ``sources`` (model -> atlas,
    agreement, stores, scores paths; rule atlas_page's params), write the page to ``out``
    atomically, and return it with the JSON size of each model's part (bytes)."""
    models, sizes = [], {}
    for model, src in sources.items():
        atlas = pd.read_csv(src["atlas"], sep="\t")
        agreement = pd.read_csv(src["agreement"], sep="\t") if src.get("agreement") else None
        examples = examples_data(src.get("stores") or None, corpus_path, src.get("scores"), atlas, settings)
        models.append(model_data(model, atlas, agreement, examples))
        sizes[model] = len(json.dumps(models[-1], separators=(",", ":")))
    html = render_page(page_data(models, settings))
    with atomic_path(out) as tmp:
        Path(tmp).write_text(html, encoding="utf-8")
    return html, sizes
