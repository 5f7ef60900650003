"""report.html: a TSV as one self-contained, sortable HTML page."""

import base64
import re

import numpy as np
import pandas as pd

from headatlas.report.html import short_number, table_html, with_head_label, write_table_html, write_tables_html


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
    assert '<th title="mean smoothed row entropy of the attention (nats)">clark_<wbr>entropy</th>' in page
    assert "<dt>det_prev</dt><dd>previous-token score" in page and "absent" not in page
    assert "<dl" not in table_html(df, "atlas")


def _headers(page: str) -> list[str]:
    return [h.replace("<wbr>", "") for h in re.findall(r"<th(?: [^>]*)?>(.*?)</th>", page)]


def test_label_key_statistic_and_ci_lead_join_columns_last():
    df = pd.DataFrame({"model": ["m", "m"], "layer": [0, 1], "head": [2, 0], "n": [5, 6], "note": ["a", "b"],
                       "det_prev": [0.5, 0.25], "det_prev_ci_low": [0.25, 0.0], "det_prev_ci_high": [0.75, 0.5]})  # fmt: skip
    assert _headers(table_html(df, "t")) == [
        "label", "det_prev", "det_prev_ci_low", "det_prev_ci_high", "n", "note", "model", "layer", "head"
    ]  # fmt: skip
    # a plain ci_low/ci_high pair belongs to the column before it; a model column that varies is not a join
    df = pd.DataFrame({"model": ["a", "b"], "method": ["x", "y"], "spearman": [0.5, 0.1], "ci_low": [0.1, 0.0],
                       "ci_high": [0.9, 0.2], "p": [0.01, 0.5]})  # fmt: skip
    assert _headers(table_html(df, "t")) == ["spearman", "ci_low", "ci_high", "model", "method", "p"]
    # an ablation effect's CI is <base>_ci_low/high
    df = pd.DataFrame({"layer": [0], "head": [0], "status": ["ok"], "ablation_lm_loss_effect": [0.5],
                       "ablation_lm_loss_ci_low": [0.25], "ablation_lm_loss_ci_high": [0.75]})  # fmt: skip
    assert _headers(table_html(df, "t"))[:4] == [
        "label", "ablation_lm_loss_effect", "ablation_lm_loss_ci_low", "ablation_lm_loss_ci_high"
    ]  # fmt: skip


def test_numbers_are_shown_to_4_significant_digits():
    assert [short_number(t) for t in ("0.123456", "12.3456", "0.50", "12", "1234567.89", "1.23456e-07", "nan", "x")] == [
        "0.1235", "12.35", "0.50", "12", "1234568", "1.235e-07", "nan", "x"
    ]  # fmt: skip
    page = table_html(pd.DataFrame({"acc": [0.123456789], "n": [123456]}), "t")
    assert '<td class="num">0.1235</td>' in page and '<td class="num">123456</td>' in page
    assert "0.123456789" not in page


def test_clark_table1_leads_with_relation_head_accuracy_and_ci(tmp_path):
    from headatlas.clark.syntax import table1

    best = pd.DataFrame({"model": ["m"], "relation": ["det"], "n": [120], "layer": [7], "head": [10], "label": ["8-11"],
                         "direction": [">"], "accuracy": [0.9431234], "ci_low": [0.91], "ci_high": [0.97],
                         "baseline_offset": [1], "baseline_accuracy": [0.5]})  # fmt: skip
    tsv = tmp_path / "results" / "clark" / "m" / "syntax" / "table1.tsv"
    tsv.parent.mkdir(parents=True)
    table1(best).to_csv(tsv, sep="\t", index=False)
    out = str(tsv)[:-4] + ".html"

    class Rule:  # what a rule script's snakemake object gives write_tables_html
        output = [str(tsv), out]

    assert write_tables_html(Rule()) == [out]
    page = open(out, encoding="utf-8").read()
    assert _headers(page)[:7] == ["paper_relation", "relation", "label", "direction", "accuracy", "ci_low", "ci_high"]
    assert _headers(page)[-2:] == ["layer", "head"]
    assert '<td>det</td><td>8-11</td><td>&gt;</td><td class="num">0.9431</td>' in page
