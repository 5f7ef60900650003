"""The Snakemake report: every reported table opens in the browser and every item has a human label.

Parse level (the rule files and the rule scripts), plus a dry run: each reported table is an
``X.html`` written beside its ``X.tsv`` by the rule that writes the TSV."""

from __future__ import annotations

import re

from conftest import REPO, dry_run

from integration.test_contract import config

RULES = sorted((REPO / "workflow" / "rules").glob("*.smk"))
REPORT = re.compile(r"report\(\s*(f?\"[^\"]+\")(.*?)\n\s*\)", re.S)


def reported_items():
    """(rule file, rule name, path, arguments) of every report(...) call."""
    out = []
    for f in RULES:
        text = f.read_text()
        for m in REPORT.finditer(text):
            rule = re.findall(r"^rule (\w+):", text[: m.start()], re.M)
            out.append((f.name, rule[-1] if rule else None, m.group(1), m.group(2)))
    return out


PAGES = {"results/atlas/index.html"}  # reported HTML that is not a table page


def rule_block(text: str, rule: str) -> str:
    return re.search(rf"^rule {rule}:\n(.*?)(?=^rule |\Z)", text, re.S | re.M).group(1)


def test_no_tsv_is_reported_only_its_html_page():
    items = reported_items()
    assert len(items) > 40
    tsvs = [(f, p) for f, _, p, _ in items if p.rstrip('"').endswith(".tsv")]
    assert not tsvs, f"report a TSV's .html page instead: {tsvs}"
    html = [(f, r, p) for f, r, p, _ in items if p.rstrip('"').endswith(".html") and p.strip('"') not in PAGES]
    assert len(html) >= 20
    for f, rule, p in html:
        block = rule_block((REPO / "workflow" / "rules" / f).read_text(), rule)
        tsv = p[:-6] + '.tsv"'
        assert tsv in block, f"{f} rule {rule}: {p} has no {tsv} among its outputs"
        script = re.search(r'script:\s*"\.\./(scripts/\w+\.py)"', block).group(1)
        assert "write_tables_html(sm" in (REPO / "workflow" / script).read_text(), f"{script} does not write {p}"


def test_every_item_has_a_unique_human_label():
    seen = {}
    for f, _, p, args in reported_items():
        assert "caption=" in args and "category=" in args and "subcategory=" in args, (f, p)
        m = re.search(r"labels=\{\s*\"item\": (\"[^\"]+\"|label)", args)
        assert m, f"{f}: {p} has no labels={{'item': ...}}"
        key = (re.search(r'category="([^"]+)"', args).group(1), re.search(r'subcategory="([^"]+)"', args).group(1),
               m.group(1))  # fmt: skip
        assert key not in seen, f"{p} and {seen[key]} share the label {key}: the report would show one of them"
        seen[key] = p


def test_dry_run_lists_each_reported_table_beside_its_tsv(tmp_path, tiny_models):
    _, _, text = dry_run(tmp_path, config(tiny_models))
    for line in re.findall(r"\n\s*output: (.*)", text):
        outs = line.split(", ")
        for o in outs:
            if o.endswith(".html") and o not in PAGES:
                assert o[:-5] + ".tsv" in outs, line
    assert "results/pande/bert/heads.html" in text and "results/atlas/bert/atlas.html" in text


def test_the_start_page_counts_models_and_derived_models_apart():
    """The report's start page (workflow/report/workflow.rst, rendered by Snakemake with Jinja2): the default
    config's 2 models and 2 derived ones, not "4 models"."""
    import jinja2
    import yaml

    template = jinja2.Template((REPO / "workflow" / "report" / "workflow.rst").read_text())

    def render(models) -> str:
        class Snakemake:
            config = {"models": models}

        return " ".join(template.render(snakemake=Snakemake).split())

    models = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]
    text = render(models)
    assert "(2 models and 2 derived from them: minilm-sst2 fine-tuned, minilm-random re-initialised)" in text, text
    assert "4 models" not in text
    assert "(1 model) on" in render(models[:1])


def test_every_caption_is_clean_restructured_text():
    """Snakemake renders each caption (workflow/report/*.rst) with docutils; a stray ``|x|`` is a substitution
    reference and prints 'Undefined substitution referenced' into the user's report run."""
    import io

    import docutils.core

    bad = {}
    for f in sorted((REPO / "workflow" / "report").glob("*.rst")):
        if f.name == "workflow.rst":  # a Jinja2 template, rendered before docutils (test above)
            continue
        err = io.StringIO()
        docutils.core.publish_string(
            f.read_text(), writer_name="html", settings_overrides={"warning_stream": err, "report_level": 2}
        )
        if err.getvalue():
            bad[f.name] = err.getvalue()
    assert not bad, bad
