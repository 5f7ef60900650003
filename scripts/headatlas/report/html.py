"""A TSV as one self-contained HTML page: a styled table sortable by clicking a column header.

The report lists this page beside (instead of) each TSV so that a table opens in the browser;
no network (inline CSS and JS), and the TSV itself is embedded as a download link. A table with
0-based ``layer`` and ``head`` columns gets a first column ``label``, the 1-based ``layer-head``
name of :func:`headatlas.core.figures.head_label`, unless it has one.

The page is read in the report's pane (about 800 px): the columns that matter come first (the label,
the key statistic and its CI: :func:`column_order`), the join columns (a constant ``model``, and
``layer`` and ``head`` beside a label) last, numbers are shown to 4 significant digits (the TSV to
download keeps every digit), headers wrap at underscores and the first column stays in view when the
table scrolls sideways.
"""

from __future__ import annotations

import base64
import fnmatch
import html
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..atlas.columns import ci_columns
from ..core.figures import head_label
from ..core.io import atomic_path

_STYLE = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:12px;color:#222}
h1{font-size:16px;margin:0 0 4px}
p.note{margin:2px 0 8px;color:#555}
input#filter{margin:0 0 8px;padding:3px 6px;width:24em}
table{border-collapse:collapse}
th,td{border:1px solid #ddd;padding:2px 6px;background:#fff}
td{white-space:nowrap}
th{background:#f0f3f7;position:sticky;top:0;z-index:1;cursor:pointer;user-select:none;
vertical-align:bottom;text-align:left}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td div.long{min-width:16em;max-width:28em;white-space:normal;overflow-wrap:break-word}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td:first-child{position:sticky;left:0}th:first-child{left:0;z-index:2}
tr:nth-child(even) td{background:#fafafa}
tr:hover td{background:#fff7d6}
h2{font-size:14px;margin:14px 0 4px}
dl.columns{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:0}
dl.columns dt{font-family:monospace}dl.columns dd{margin:0;color:#444}
"""

# click a header: sort by it (numbers as numbers, empty cells last), click again to reverse;
# the filter box keeps the rows whose text contains every word typed
_SCRIPT = """
(function(){
const t=document.getElementById('t'),b=t.tBodies[0],hs=t.tHead.rows[0].cells;
Array.from(hs).forEach((h,i)=>h.addEventListener('click',()=>{
 const d=h.classList.contains('asc')?-1:1;
 Array.from(hs).forEach(x=>x.classList.remove('asc','desc'));
 h.classList.add(d>0?'asc':'desc');
 const key=r=>{const s=r.cells[i].textContent.trim(),n=Number(s);
  return s===''?null:(isFinite(n)?n:s.toLowerCase());};
 const rows=Array.from(b.rows).map(r=>[key(r),r]);
 rows.sort((x,y)=>{const a=x[0],c=y[0];if(a===c)return 0;if(a===null)return 1;if(c===null)return -1;
  if(typeof a===typeof c)return (a<c?-1:1)*d;return (typeof a==='number'?-1:1)*d;});
 rows.forEach(x=>b.appendChild(x[1]));}));
const f=document.getElementById('filter');
f.addEventListener('input',()=>{const w=f.value.toLowerCase().split(/\\s+/).filter(Boolean);
 Array.from(b.rows).forEach(r=>{const s=r.textContent.toLowerCase();
  r.style.display=w.every(x=>s.includes(x))?'':'none';});});
})();
"""


def with_head_label(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a first column ``label`` (1-based ``layer-head``) when it has integer 0-based
    ``layer`` and ``head`` columns and no ``label``; empty where layer or head is negative or missing
    (a per-layer row, a top-n row)."""
    if "label" in df or "layer" not in df or "head" not in df:
        return df
    layer = pd.to_numeric(df["layer"], errors="coerce")
    head = pd.to_numeric(df["head"], errors="coerce")
    ok = layer.notna() & head.notna() & (layer >= 0) & (head >= 0)
    if not ok.any():
        return df
    labels = [head_label(a, b) if k else "" for a, b, k in zip(layer, head, ok)]
    return df.assign(label=labels)[["label"] + [c for c in df.columns]]


JOIN_COLUMNS = ("model", "layer", "head")  # what tables are joined on: last on the page
# tables whose rows are not heads: the columns they lead with (fnmatch pattern of the path below results/)
LEAD = {
    "clark/*/syntax/table1.tsv": ("paper_relation", "relation", "label", "direction", "accuracy", "ci_low", "ci_high"),
}
SIGNIFICANT = 4  # digits of a number shown on the page
LONG_TEXT = 40  # characters: a longer text cell wraps in a column of its own width


def key_statistic(columns) -> list[str]:
    """The key statistic of a table and its CI: the first column with ``<name>_ci_low/high`` (or, for
    ``..._effect``, ``..._ci_low/high``: :func:`headatlas.atlas.columns.ci_columns`), else the column just
    before a plain ``ci_low``, ``ci_high`` pair; [] when the table has no CI."""
    cols = [str(c) for c in columns]
    for c in cols:
        if pair := ci_columns(c, cols):
            return [c, *pair]
    if "ci_low" in cols and "ci_high" in cols:
        i = cols.index("ci_low")
        if i > 0 and cols[i - 1] not in ("label", *JOIN_COLUMNS):
            return [cols[i - 1], "ci_low", "ci_high"]
    return []


def column_order(df: pd.DataFrame, lead: tuple[str, ...] = ()) -> list[str]:
    """The columns as the page shows them: ``lead`` (or ``label``, the key statistic and its CI), then
    the others in the TSV's order, then the join columns: ``model`` when it is one value throughout,
    ``layer`` and ``head`` when a ``label`` names the head."""
    cols = [str(c) for c in df.columns]
    front = [c for c in lead if c in cols] if lead else [c for c in ["label", *key_statistic(cols)] if c in cols]
    back = [c for c in ("layer", "head") if "label" in cols and c in cols]
    if "model" in cols and df["model"].nunique(dropna=False) <= 1:
        back.insert(0, "model")
    back = [c for c in back if c not in front]
    return front + [c for c in cols if c not in front and c not in back] + back


_NUMBER = re.compile(r"[+-]?(\d*)(?:\.(\d*))?(?:[eE][+-]?\d+)?")


def short_number(text: str, digits: int = SIGNIFICANT) -> str:
    """A number's text to ``digits`` significant digits (integers and shorter numbers as written;
    numbers of 10**digits or more without decimals)."""
    m = _NUMBER.fullmatch(text)
    if not m or not (m[1] or m[2]) or (m[2] is None and "e" not in text.lower()):
        return text
    if len((m[1] + (m[2] or "")).lstrip("0")) <= digits:
        return text
    x = float(text)
    return f"{x:.0f}" if abs(x) >= 10**digits else f"{x:.{digits}g}"


def _numeric(col: pd.Series) -> bool:
    """Whether a column holds numbers (right-aligned): a numeric dtype, or text that all parses as numbers."""
    if pd.api.types.is_bool_dtype(col):
        return False
    if pd.api.types.is_numeric_dtype(col):
        return True
    v = col.dropna()
    return bool(len(v)) and pd.to_numeric(v, errors="coerce").notna().all()


def table_html(
    df: pd.DataFrame,
    title: str,
    tsv_name: str | None = None,
    tsv_bytes: bytes | None = None,
    notes: dict[str, str] | None = None,
    lead: tuple[str, ...] = (),
) -> str:
    """The page for ``df``, its columns in :func:`column_order` (``lead``: the columns to start with),
    cells as the TSV writes them but numbers to :data:`SIGNIFICANT` digits; ``tsv_bytes`` become a download
    link; ``notes`` (column -> what it holds) become the headers' tooltips and a list under the table."""
    df = with_head_label(df.rename(columns=str))
    df = df[column_order(df, lead)]
    numeric = [_numeric(df[c]) for c in df.columns]
    esc = html.escape

    def header(c: str) -> str:  # a long name wraps after its underscores
        return esc(c).replace("_", "_<wbr>")

    notes = {str(c): t for c, t in (notes or {}).items() if c in df.columns}
    head = "".join(
        f'<th title="{esc(notes[str(c)])}">{header(str(c))}</th>' if str(c) in notes else f"<th>{header(str(c))}</th>"
        for c in df.columns
    )
    legend = ""
    if notes:
        items = "".join(f"<dt>{esc(c)}</dt><dd>{esc(t)}</dd>" for c, t in notes.items())
        legend = f'<h2>Columns</h2>\n<dl class="columns">{items}</dl>\n'

    cols = [df[c].to_numpy(dtype=object) for c in df.columns]
    rows = []
    for i in range(len(df)):
        cells = []
        for v, num in zip((c[i] for c in cols), numeric):
            s = "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
            if num:
                cells.append(f'<td class="num">{esc(short_number(s))}</td>')
            else:  # a long text wraps in a column of 16-28 em, not in one squeezed to a word
                cells.append(
                    f'<td><div class="long">{esc(s)}</div></td>' if len(s) > LONG_TEXT else f"<td>{esc(s)}</td>"
                )
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = (
        f"{len(df):,} rows, {len(df.columns)} columns. Click a column header to sort; type to filter rows. "
        f"Numbers to {SIGNIFICANT} significant digits (the TSV has every digit)."
    )
    if "label" in df and "layer" in df and "head" in df:
        note += " Heads: label = 1-based layer-head (as in the papers); the layer and head columns are 0-based."
    link = ""
    if tsv_bytes is not None:
        data = base64.b64encode(tsv_bytes).decode("ascii")
        name = esc(tsv_name or "table.tsv")
        link = f' <a download="{name}" href="data:text/tab-separated-values;base64,{data}">Download {name}</a>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>\n"
        f'<h1>{esc(title)}</h1><p class="note">{esc(note)}{link}</p>\n'
        '<input id="filter" type="search" placeholder="filter rows">\n'
        f'<table id="t"><thead><tr>{head}</tr></thead><tbody>\n' + "\n".join(rows) + "\n</tbody></table>\n"
        f"{legend}<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def write_table_html(
    tsv: str | Path,
    out: str | Path,
    title: str | None = None,
    notes: dict[str, str] | None = None,
    lead: tuple[str, ...] = (),
) -> None:
    """Render the TSV file ``tsv`` as :func:`table_html` at ``out`` (atomically)."""
    tsv = Path(tsv)
    raw = tsv.read_bytes()
    # cells keep the TSV's text; columns that parse as numbers sort and align as numbers
    try:
        df = pd.read_csv(tsv, sep="\t", keep_default_na=False, na_values=[""], dtype=str)
    except pd.errors.EmptyDataError:  # an empty table (no columns) is an empty page
        df = pd.DataFrame()
    with atomic_path(out) as tmp:
        Path(tmp).write_text(table_html(df, title or tsv.stem, tsv.name, raw, notes, lead), encoding="utf-8")


def write_tables_html(snakemake, notes: dict[str, dict[str, str]] | None = None) -> list[str]:
    """For every output ``X.html`` of a rule whose ``X.tsv`` is also an output, render it; the
    title is the path below ``results/``, which also picks the columns it leads with (:data:`LEAD`);
    ``notes`` maps an output page to its column notes (:func:`table_html`). Call at the end of a rule script."""
    outs = [str(p) for p in snakemake.output]
    done = []
    for out in outs:
        if out.endswith(".html") and out[:-5] + ".tsv" in outs:
            tsv = out[:-5] + ".tsv"
            title = tsv.split("results/", 1)[-1]
            lead = next((cols for pat, cols in LEAD.items() if fnmatch.fnmatch(title, pat)), ())
            write_table_html(tsv, out, title, (notes or {}).get(out), lead)
            done.append(out)
    return done
