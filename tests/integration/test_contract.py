"""The analysis contract (docs/architecture.md) on dry runs: one switch, one model filter, the atlas registry."""

from __future__ import annotations

import re

from conftest import REPO, dry_run

from integration.test_workflow import tiny_config, wildcard_set


def config(tiny_models, **pande):
    cfg = tiny_config(tiny_models)
    cfg["analysis"]["pande"] = {"corpora": ["ewt"], **pande}
    return cfg


def atlas_inputs(text: str) -> dict[str, str]:
    """model -> the input line of its atlas job in a dry run's listing."""
    out = {}
    for block in re.split(r"\n(?=\S)", text):
        if block.startswith("rule atlas:"):
            model = re.search(r"wildcards: model=(\S+)", block).group(1)
            out[model] = re.search(r"input: (.*)", block).group(1)
    return out


def test_present_section_is_on_and_the_atlas_reads_it(tmp_path, tiny_models):
    stats, jobs, text = dry_run(tmp_path, config(tiny_models))
    assert wildcard_set(jobs, "pande_test", "model") == {("bert",), ("gpt2",)}
    inputs = atlas_inputs(text)
    assert set(inputs) == {"bert", "gpt2"}
    assert (
        "results/pande/bert/heads.tsv" in inputs["bert"] and "results/clark/bert/wiki/behaviour.tsv" in inputs["bert"]
    )
    assert "jomyaeng" not in inputs["bert"] and "syntax" not in inputs["bert"]  # absent sections are off


def test_activate_false_turns_an_analysis_and_its_atlas_columns_off(tmp_path, tiny_models):
    stats, jobs, text = dry_run(tmp_path, config(tiny_models, activate=False))
    assert not any(rule.startswith("pande") for rule in stats)
    assert all("results/pande/" not in line for line in atlas_inputs(text).values())
    assert "clark_surface_stats" in stats


def test_models_list_is_the_one_model_filter(tmp_path, tiny_models):
    stats, jobs, text = dry_run(tmp_path, config(tiny_models, models=["gpt2"]))
    assert wildcard_set(jobs, "pande_test", "model") == {("gpt2",)}
    inputs = atlas_inputs(text)
    assert "results/pande/" not in inputs["bert"] and "results/pande/gpt2/heads.tsv" in inputs["gpt2"]


def test_atlas_can_be_switched_off(tmp_path, tiny_models):
    cfg = config(tiny_models)
    cfg["analysis"]["atlas"] = {"activate": False}
    stats, _, _ = dry_run(tmp_path, cfg)
    assert "atlas" not in stats and "atlas_cross_model" not in stats and "pande_test" in stats


def test_every_figure_is_a_png_with_an_svg_beside_it(tmp_path, tiny_models):
    _, _, text = dry_run(tmp_path, config(tiny_models))
    outputs = [o for line in re.findall(r"\n\s*output: (.*)", text) for o in line.split(", ")]
    pngs = [o for o in outputs if o.endswith(".png")]
    assert len(pngs) > 10  # Clark surface, Pande and the atlas draw figures here
    missing = sorted(p for p in pngs if p[: -len(".png")] + ".svg" not in outputs)
    assert not missing, missing
    assert len([o for o in outputs if o.endswith(".svg")]) == len(pngs)


def test_rule_scripts_are_named_after_their_rules():
    """Every rule's script is workflow/scripts/<rule>.py (docs/architecture.md), and every script there has a rule."""

    repo = REPO
    pairs = []
    for smk in sorted((repo / "workflow" / "rules").glob("*.smk")):
        rule = None
        for line in smk.read_text().splitlines():
            m = re.match(r"\s*rule (\w+):", line)
            if m:
                rule = m.group(1)
            m = re.search(r'"\.\./scripts/(\w+)\.py"', line)
            if m:
                pairs.append((smk.name, rule, m.group(1)))
    assert len(pairs) > 40
    assert [p for p in pairs if p[1] != p[2]] == []
    assert {p.stem for p in (repo / "workflow" / "scripts").glob("*.py")} == {p[2] for p in pairs}
