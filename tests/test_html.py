"""report.html: a TSV as one self-contained, sortable HTML page."""

import base64
import re

import numpy as np
import pandas as pd

from headatlas.report.html import table_html, with_head_label, write_table_html


def test_head_label_column_is_1_based_and_first():
    df = pd.DataFrame({"model": ["m"] * 3, "layer": [0, 7, 2], "head": [0, 9, -1], "x": [1.0, 2.0, 3.0]})
    out = with_head_label(df)
    assert list(out.columns) == ["label", "model", "layer", "head", "x"]
    assert list(out["label"]) == ["1-1", "8-10", ""]  # head -1: a per-layer row, no head label
    assert "label" not in with_head_label(df.drop(columns="head"))
    assert with_head_label(out) is out  # an existing label is kept


def test_table_html_escapes_aligns_and_embeds_the_tsv():
    df = pd.DataFrame({"name": ["<b>&", "x"], "acc": [0.5, np.nan], "flag": [True, False]})
    page = table_html(df, "T <1>", "t.tsv", b"name\tacc\n")
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>T &lt;1&gt;</title>" in page
    assert "<td>&lt;b&gt;&amp;</td>" in page and "<b>&" not in page
    assert '<td class="num">0.5</td>' in page and '<td class="num"></td>' in page  # NaN is an empty cell
    assert "<td>True</td>" in page  # booleans are not numbers
    assert "<th>name</th><th>acc</th><th>flag</th>" in page
    data = re.search(r'download="t.tsv" href="data:text/tab-separated-values;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(data) == b"name\tacc\n"
    assert "http" not in page  # no network
    assert page.count("<tr>") == 3  # header + 2 rows
    assert "addEventListener('click'" in page  # sortable


def test_write_table_html_keeps_the_tsv_text(tmp_path):
    tsv = tmp_path / "table1.tsv"
    tsv.write_text("relation\tlayer\thead\tacc\nnsubj\t3\t1\t0.50\nobj\t\t\t\n")
    out = tmp_path / "table1.html"
    write_table_html(tsv, out, "Table 1")
    page = out.read_text()
    assert "<h1>Table 1</h1>" in page
    assert '<td class="num">0.50</td>' in page  # the TSV's own text, not 0.5
    assert "<td>4-2</td>" in page
    assert "2 rows, 5 columns" in page
    assert not list(tmp_path.glob("*.tmp*"))


def test_an_empty_tsv_is_an_empty_page(tmp_path):
    tsv = tmp_path / "empty.tsv"
    tsv.write_text("")
    write_table_html(tsv, tmp_path / "empty.html")
    assert "0 rows, 0 columns" in (tmp_path / "empty.html").read_text()


def test_column_notes_become_header_tooltips_and_a_list():
    from headatlas.atlas import columns

    df = pd.DataFrame({"layer": [0], "head": [1], "clark_entropy": [2.5], "det_prev": [0.25]})
    notes = {c: columns.describe(c).text() for c in ("clark_entropy", "det_prev", "absent")}
    page = table_html(df, "atlas", notes=notes)
    assert '<th title="mean smoothed row entropy of the attention (nats)">clark_entropy</th>' in page
    assert "<dt>det_prev</dt><dd>previous-token score" in page and "absent" not in page
    assert "<dl" not in table_html(df, "atlas")
