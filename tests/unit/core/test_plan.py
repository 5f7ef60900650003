"""headatlas.core.plan: shapes, the dry-run job list, the non-negative fit (exact on synthetic cost records),
predictions, the parse-time memory warning and ``headatlas plan`` on the tiny config."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from headatlas.core import plan
from headatlas.core.plan import Job, Shape


def test_shapes_of_known_configs():
    """Parameter counts from the widths: Llama-3-8B 8.03e9 and 70B 70.55e9 (their model cards: 8.0B, 70.6B);
    GPT-2 small 124.4M with its tied embeddings (position embeddings are not counted: 0.8M)."""
    s8 = plan.shape_from_config(plan.BUILTIN_SHAPES["meta-llama/Meta-Llama-3-8B"])
    assert (s8.layers, s8.heads, s8.kv_heads, s8.d_model, s8.head_dim) == (32, 32, 8, 4096, 128)
    assert s8.params == pytest.approx(8.03e9, rel=2e-3)
    assert s8.body_params == pytest.approx(8.03e9 - 2 * 128256 * 4096, rel=2e-3)  # without embeddings, output
    s70 = plan.shape_from_config(plan.BUILTIN_SHAPES["meta-llama/Meta-Llama-3-70B"])
    assert (s70.layers, s70.heads, s70.cells) == (80, 64, 5120)
    assert s70.params == pytest.approx(70.55e9, rel=2e-3)
    gpt2 = plan.shape_from_config({"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257})
    assert gpt2.params == pytest.approx(123.5e6, rel=1e-3) and gpt2.head_dim == 64
    assert plan.parse_shape("32,32,8,4096,8B") == Shape(32, 32, 8, 4096, 128, 8e9, 12 * 32 * 4096**2)
    with pytest.raises(plan.PlanError, match="L,H,KV,d,P"):
        plan.parse_shape("32,32")


def test_model_shape_lookup_order(tmp_path):
    """A hint first, then the config.json the workflow wrote, then the built-in table; a derived model has its
    base's shape; an unknown model is an error that says how to give its shape."""
    models = {
        "llama": {"name": "llama", "source": {"hub": "meta-llama/Meta-Llama-3-8B"}},
        "ft": {"name": "ft", "source": {"finetuned": {"base": "llama", "task": "sst2"}}},
        "g": {"name": "g", "source": {"gguf": "x.gguf", "package": "p"}},
        "odd": {"name": "odd", "source": {"hub": "someone/unknown"}},
    }
    assert plan.model_shape("ft", models, tmp_path).cells == 1024
    hint = Shape(2, 2, 2, 8, 4, 100.0)
    assert plan.model_shape("llama", models, tmp_path, {"llama": hint}) == hint
    written = tmp_path / "results" / "models" / "gguf" / "g"
    written.mkdir(parents=True)
    (written / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "num_attention_heads": 5,
                                                     "hidden_size": 40, "vocab_size": 10}))  # fmt: skip
    assert plan.model_shape("g", models, tmp_path).cells == 15
    with pytest.raises(plan.PlanError, match="--shape odd=L,H,KV,d,P"):
        plan.model_shape("odd", models, tmp_path)


def _rows(coeffs: dict[str, dict[str, float]], n: int, seed: int = 0):
    """Synthetic cost records: each rule's jobs with random features, their CPU-seconds exactly the sum of
    ``coeffs[rule][feature] * feature``."""
    rng = np.random.default_rng(seed)
    rows = []
    for rule, c in coeffs.items():
        for i in range(n):
            feats = {k: float(rng.uniform(1, 100)) * (1e9 if k != "one" else 1 / 100) for k in plan.FAMILIES[
                plan.family(rule)]}  # fmt: skip
            feats["one"] = 1.0
            cpu = sum(v * feats[k] for k, v in c.items())
            job = Job(rule, {"model": f"m{i}"})
            rows.append((job, feats, {"cpu_s": cpu, "peak_rss_bytes": 1e9 + feats.get("P", 0), "output_bytes": 0}))
    return rows


def test_fit_recovers_known_coefficients():
    """Records that are exactly a non-negative sum of the family's features give back those coefficients, a
    zero coefficient stays zero, and the prediction for a new job is exact."""
    truth = {
        "extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-10},
        "ablation_exact": {"one": 1.5, "P": 0.0, "abl": 3e-10},
        "clark_js_distances": {"one": 0.7, "LH2N": 4e-9},
    }
    coeffs = plan.fit(_rows(truth, 12))
    for rule, c in truth.items():
        got = coeffs[rule]["cpu_s"]
        for k, v in c.items():
            assert got.get(k, 0.0) == pytest.approx(v, rel=1e-6, abs=1e-12), (rule, k)
    assert coeffs["extract_attention"]["family"] == "forward" and coeffs["extract_attention"]["jobs"] == 12
    (job, feats, meas), *_ = _rows(truth, 1, seed=7)
    assert plan.predict(coeffs, job, feats)["cpu_s"] == pytest.approx(meas["cpu_s"], rel=1e-6)
    assert plan.predict(coeffs, Job("never_measured"), {"one": 1.0})["cpu_s"] is None


def test_memory_is_the_weights_plus_the_fitted_terms():
    """A rule that holds the model's weights: its peak RSS is fitted as the weights plus the other terms, so that
    weights growing with the logits rows (collinear on the models measured) do not take the logits' share: a
    larger model with the same logits rows is predicted by its weights alone growing."""
    rows = []
    for i, (w, r) in enumerate([(0.5e9, 0.8e9), (2.5e9, 2.5e9), (1.0e9, 1.3e9)]):  # weights and logits grow together
        feats = {"one": 1.0, "Pbytes": w, "Rlogits": r, "LHn2": 1e5, "abl": 1e12}
        rows.append((Job("quiet_ablation", {"model": f"m{i}"}), feats,
                     {"cpu_s": 1.0, "peak_rss_bytes": 3e8 + w + 2.0 * r, "output_bytes": 1.0}))  # fmt: skip
    mem = plan.fit(rows)["quiet_ablation"]["peak_rss_bytes"]
    assert mem["Pbytes"] == 1.0 and mem["Rlogits"] == pytest.approx(2.0, rel=1e-6)
    big = {"one": 1.0, "Pbytes": 7.1e9, "Rlogits": 2.5e9, "LHn2": 1e5}
    got = plan.predict({"quiet_ablation": {"peak_rss_bytes": mem}}, Job("quiet_ablation"), big)["peak_rss_bytes"]
    assert got == pytest.approx(3e8 + 7.1e9 + 5e9, rel=1e-6)
    assert "Pbytes" not in plan.features_for("quiet_ablation", "peak_rss_bytes")
    assert "Pbytes" in plan.features_for("cache_model", "peak_rss_bytes")  # dequantising holds more than the weights


def test_shared_memory_terms_are_fitted_jointly():
    """An exact pass's logits and a backward pass's activations and logits are the same bytes in every rule that has
    them: one coefficient each over those rules, each rule keeping its own start-up. A rule whose jobs never run a
    backward pass (here the exact ablation) gets the coefficients the other rule's jobs identify."""
    rng = np.random.default_rng(3)
    shared = {"Rlogits": 2.5, "Gact": 4.0, "Glogits": 3.0}
    start = {"ablation_exact": 4e8, "quiet_ablation": 2e8}
    rows = []
    for rule in start:
        for i in range(6):
            f = {"one": 1.0, "Pbytes": float(rng.uniform(1, 8)) * 1e9, "Rlogits": float(rng.uniform(0.5, 3)) * 1e9}
            back = rule == "quiet_ablation"
            f["Gact"], f["Glogits"] = (float(rng.uniform(0.1, 2)) * 1e9 if back else 0.0 for _ in range(2))
            peak = f["Pbytes"] + start[rule] + sum(v * f[k] for k, v in shared.items())
            rows.append((Job(rule, {"model": f"m{i}"}), f, {"cpu_s": 1.0, "peak_rss_bytes": peak, "output_bytes": 1.0}))
    coeffs = plan.fit(rows)
    for rule, one in start.items():
        mem = coeffs[rule]["peak_rss_bytes"]
        assert mem["Pbytes"] == 1.0 and mem["one"] == pytest.approx(one, rel=1e-6)
        for k, v in shared.items():
            assert mem[k] == pytest.approx(v, rel=1e-6), (rule, k)
    assert coeffs["ablation_exact"]["cpu_s"]  # the other targets are fitted per rule as before


def test_holdout_check_is_exact_when_the_model_is():
    truth = {"extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-10}}
    rows = _rows(truth, 10)
    check = plan.check_holdout(rows, {"m9"})
    assert check["held_out"] == ["m9"] and check["total"]["error"] == pytest.approx(0.0, abs=1e-6)
    assert check["rules"]["extract_attention"]["measured"] == pytest.approx(rows[9][2]["cpu_s"])


def test_saved_rows_fit_as_the_runs_did(tmp_path):
    """A fit's data written with --save-rows and read back gives the same coefficients, and the CLI fits on it
    (with the held-out check) without any run directory."""
    truth = {"extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-10}, "atlas": {"one": 2.0, "LH": 1e-3}}
    rows = _rows(truth, 10)
    plan.save_rows(rows, tmp_path / "rows.json")
    back = plan.load_rows(tmp_path / "rows.json")
    assert [(j.rule, j.model()) for j, _, _ in back] == [(j.rule, j.model()) for j, _, _ in rows]
    assert plan.fit(back) == plan.fit(rows)
    out = tmp_path / "cost.json"
    assert plan.main(["fit", "--rows", str(tmp_path / "rows.json"), "--out", str(out), "--hold-out", "m9"]) == 0
    doc = json.loads(out.read_text())
    assert doc["rules"] == json.loads(json.dumps(plan.fit(rows))) and doc["check"]["held_out"] == ["m9"]
    assert doc["runs"] == [{"rows": str(tmp_path / "rows.json"), "jobs": 20, "models": [f"m{i}" for i in range(10)]}]


def test_a_pilot_of_the_held_out_model_is_fitted_on_not_predicted(tmp_path, capsys):
    """``fit --hold-out m9 --pilot ROWS``: the pilot's jobs of m9 are in the fit, its other jobs are predicted. The
    held-out model alone has an attention term (the others' inputs are too short to have one): without the pilot
    the fit cannot see it and misses; with it the check is exact."""
    truth = {"extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-9}}
    rows = _rows(truth, 10)
    for job, f, m in rows:
        if job.model() != "m9":
            m["cpu_s"] -= 5e-9 * f["attn"]
            f["attn"] = 0.0
    pilot = _rows(truth, 10, seed=5)[-1:]  # another job of m9
    assert plan.check_holdout(rows, {"m9"})["total"]["error"] < -0.2
    check = plan.check_holdout(rows, {"m9"}, pilot)
    assert check["pilot_jobs"] == 1 and check["rules"]["extract_attention"]["jobs"] == 1
    assert check["total"]["error"] == pytest.approx(0.0, abs=1e-6)
    plan.save_rows(rows, tmp_path / "rows.json")
    plan.save_rows(pilot, tmp_path / "pilot.json")
    out = tmp_path / "cost.json"
    args = ["fit", "--rows", str(tmp_path / "rows.json"), "--out", str(out), "--pilot", str(tmp_path / "pilot.json")]
    assert plan.main(args + ["--hold-out", "m9"]) == 0
    printed = capsys.readouterr().out.splitlines()  # every rule of the held-out model, without and with the pilot
    assert printed[0] == "held out: m9, fitted without them" and printed[2].startswith("extract_attention    ")
    assert printed[4] == "held out: m9, with their pilot in the fit" and printed[6].split()[4] == "+0%"
    doc = json.loads(out.read_text())
    assert doc["check"]["total"]["error"] == pytest.approx(0.0, abs=1e-6) and doc["runs"][-1]["pilot"] is True
    assert doc["check_without_pilot"]["total"]["error"] < -0.2 and doc["rules"]["extract_attention"]["jobs"] == 11
    acc = doc["accuracy"]["cpu_s"]
    assert acc["on"] == "m9 held out of the fit, 11 jobs" and acc["total"] < -0.2
    assert acc["pilot"]["on"] == "m9 held out but for a pilot run of 1 jobs" and acc["pilot"]["total"] == pytest.approx(
        0.0, abs=1e-6)  # fmt: skip
    lines = plan.accuracy_lines(doc["accuracy"])
    assert any(line.startswith("  CPU, calibrated by a pilot: total +0%") for line in lines), lines
    with pytest.raises(SystemExit):  # a pilot without a check is just another run
        plan.main(args)


def test_fit_of_some_targets_keeps_the_others(tmp_path):
    """`fit --targets peak_rss_bytes` refits the memory and keeps the stored model's CPU coefficients, its runs
    (each marked with the targets fitted on it), its held-out check, and a rule only the stored model knows;
    the refit's own held-out check is stored beside."""
    truth = {"extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-10}}
    out = tmp_path / "cost.json"
    old_rules = {"extract_attention": {"family": "forward", "jobs": 2, "cpu_s": {"one": 99.0},
                                       "peak_rss_bytes": {"one": 1.0}},
                 "atlas": {"family": "summary", "jobs": 1, "cpu_s": {"one": 5.0}}}  # fmt: skip
    plan.save_model(old_rules, [{"rows": "old", "jobs": 3}], out, {"held_out": ["old"]})
    plan.save_rows(_rows(truth, 10), tmp_path / "rows.json")
    args = ["fit", "--rows", str(tmp_path / "rows.json"), "--out", str(out), "--targets", "peak_rss_bytes"]
    assert plan.main(args + ["--hold-out", "m9"]) == 0
    doc = json.loads(out.read_text())
    ext = doc["rules"]["extract_attention"]
    assert ext["cpu_s"] == {"one": 99.0} and ext["peak_rss_bytes"] != {"one": 1.0}
    assert doc["rules"]["atlas"] == old_rules["atlas"] and doc["check"] == {"held_out": ["old"]}
    assert doc["check_peak_rss_bytes"]["held_out"] == ["m9"]
    assert [r["targets"] for r in doc["runs"]] == [["cpu_s", "output_bytes"], ["peak_rss_bytes"]]
    assert plan.main(args) == 0  # a second memory refit replaces the first one's run, keeps the CPU's
    assert [(r["rows"], r["targets"]) for r in json.loads(out.read_text())["runs"]] == [
        ("old", ["cpu_s", "output_bytes"]), (str(tmp_path / "rows.json"), ["peak_rss_bytes"])]  # fmt: skip
    with pytest.raises(SystemExit):
        plan.main(args[:-1] + ["cpu"])


def test_a_refit_keeps_earlier_refits_checks_and_records_its_accuracy(tmp_path):
    """A disk refit after a memory refit keeps the memory refit's held-out check and recorded accuracy; each
    held-out refit records the accuracy of the targets it fitted, and a refit without a hold-out drops the
    recorded accuracy of the targets it replaced (it described the old coefficients)."""
    truth = {"extract_attention": {"one": 3.0, "PT": 2e-9, "attn": 5e-10}}
    out = tmp_path / "cost.json"
    plan.save_rows(_rows(truth, 10), tmp_path / "rows.json")
    base = ["fit", "--rows", str(tmp_path / "rows.json"), "--out", str(out)]
    assert plan.main(base + ["--hold-out", "m9"]) == 0
    assert set(json.loads(out.read_text())["accuracy"]) == set(plan.TARGETS)
    assert plan.main(base + ["--targets", "peak_rss_bytes", "--hold-out", "m9"]) == 0
    assert plan.main(base + ["--targets", "output_bytes", "--hold-out", "m8"]) == 0
    doc = json.loads(out.read_text())
    assert doc["check_peak_rss_bytes"]["held_out"] == ["m9"] and doc["check_output_bytes"]["held_out"] == ["m8"]
    assert doc["accuracy"]["output_bytes"]["on"].startswith("m8 held out")
    assert doc["accuracy"]["peak_rss_bytes"]["on"].startswith("m9 held out")
    assert doc["accuracy"]["cpu_s"]["total"] == pytest.approx(0.0, abs=1e-6)  # the model is exact
    assert plan.main(base + ["--targets", "cpu_s"]) == 0
    assert set(json.loads(out.read_text())["accuracy"]) == {"peak_rss_bytes", "output_bytes"}


def test_plan_says_what_a_checked_rule_costs_if_the_checks_go_the_other_way():
    """A rule whose exact forwards hang on the per-layer checks is planned one way and its line gives the other:
    the exact ablation as if every layer passed (4 layers x 2 checked heads + 4, split over 2 jobs) and what it
    costs if every layer failed (every one of the 32 heads), the zero-ablation the other way round (every head,
    or 4 layers x 1 checked head + 4); the rule's other CPU is the sum over its jobs. One head's exact pass runs
    the layers from the head's own on: 5/8 of the body of 4 layers, heads spread evenly over them."""
    cfg = {
        "models": [{"name": "b", "source": {"hub": "x/b"}, "max_length": 16}],
        "corpora": {},
        "analysis": {
            "ablation": {"exact_max_heads": 20, "check_heads": 2, "exact_jobs": 2},
            "quiet": {"corpora": ["c"], "n_sequences": 10, "length": 32, "ablation_sequences": 8,
                      "exact_max_heads": 8, "check_heads": 1},
        },
    }  # fmt: skip
    hints = {"b": Shape(4, 8, 8, 128, 16, 2e6)}  # 32 heads; no vocabulary: the logits cost the body's 2e6
    model = {"rules": {"ablation_exact": {"family": "ablation_exact", "cpu_s": {"one": 10.0, "abl": 1e-9}},
                       "quiet_ablation": {"family": "zero_ablation", "cpu_s": {"one": 5.0, "abl": 1e-8}}}}  # fmt: skip
    jobs = [Job("ablation_exact", {"model": "b", "part": str(i)}) for i in range(2)] + [
        Job("quiet_ablation", {"model": "b"})
    ]
    planned = plan.plan_jobs(jobs, cfg, model, ".", hints)
    t_abl, tokens, w = 16 * 36 + 200 * 24, 8 * 32, 2e6 * 5 / 8
    assert planned[0].cpu_s == pytest.approx(10 + 1e-9 * 6 * w * t_abl)
    assert planned[0].other_cpu_s == pytest.approx(10 + 1e-9 * 16 * w * t_abl)
    assert planned[2].cpu_s == pytest.approx(5 + 1e-8 * 32 * w * tokens)
    assert planned[2].other_cpu_s == pytest.approx(5 + 1e-8 * 8 * w * tokens)
    summary = plan.summarize(planned)
    abl = summary["rules"]["ablation_exact"]
    assert abl["cpu_s"] == pytest.approx(2 * planned[0].cpu_s) and abl["other_cpu_s"] == pytest.approx(235.04)
    text = "\n".join(plan.report(summary))
    assert "(as if every layer passes its check; 3.9 min if every layer fails it)" in text
    assert "(as if every layer fails its check; 31 s if every layer passes it)" in text
    cfg["analysis"]["quiet"]["on_check_fail"] = "unreliable"  # failing layers add no heads: one way only
    assert plan.plan_jobs(jobs[2:], cfg, model, ".", hints)[0].other_cpu_s is None


def test_accuracy_counts_the_large_rules_and_the_plan_prints_it():
    """Per target the total's error and the large rules' range: rules under 5 CPU-minutes and peaks under 2 GB
    are left out of the range; the plan's report prints each recorded line."""

    def rule(measured, predicted, peak_m, peak_p, disk_m, disk_p):
        return {"measured": measured, "predicted": predicted, "error": predicted / measured - 1, "unknown": 0,
                "peak_measured": peak_m, "peak_predicted": peak_p, "disk_measured": disk_m, "disk_predicted": disk_p}  # fmt: skip

    result = {
        "rules": {
            "a": rule(1000.0, 1300.0, 10e9, 8e9, 100.0, 150.0),
            "b": rule(400.0, 200.0, 4e9, 4.4e9, 0.0, 0.0),
            "c": rule(10.0, 100.0, 1e9, 9e9, 100.0, 50.0),
        },  # fmt: skip
        "total": {"measured": 1410.0, "predicted": 1600.0, "error": 190.0 / 1410.0},
    }
    acc = plan.accuracy(result)
    assert acc["cpu_s"] == {"total": 190.0 / 1410.0, "rules": 2, "lowest": -0.5, "highest": pytest.approx(0.3),
                            "within_35": 1}  # fmt: skip
    assert acc["peak_rss_bytes"]["rules"] == 2 and acc["peak_rss_bytes"]["lowest"] == pytest.approx(-0.2)
    assert acc["peak_rss_bytes"]["highest"] == pytest.approx(0.1) and acc["peak_rss_bytes"]["within_35"] == 2
    assert acc["output_bytes"]["total"] == 0.0 and acc["output_bytes"]["rules"] == 0
    recorded = {t: {"on": "a check", **a} for t, a in acc.items()}
    summary = {"rules": {}, "models": {}, "total": {"jobs": 0, "cpu_s": 0.0, "output_bytes": 0.0, "device_s": 0.0,
                                                    "unknown": 0, "peak_rss_bytes": 0.0}}  # fmt: skip
    lines = plan.report(summary, recorded=recorded)
    assert "  CPU: total +13%, 2 rules of 5 CPU-min or more -50% to +30% (1 within +-35%) (a check)" in lines
    assert "  peak memory: 2 rules of 2 GB or more -20% to +10% (2 within +-35%) (a check)" in lines
    assert "  disk: total +0% (a check)" in lines
    assert plan.report(summary)[-1].startswith("wall on")  # nothing recorded: no accuracy lines


def test_features_scale_as_the_formulas_say():
    """Doubling the heads doubles the per-head terms and quadruples the head-pair terms; the exact ablation
    runs one forward per head up to exact_max_heads, then L * check_heads + 4, each through the layers from the
    head's own on (5/8 of the body of 4 layers) and the logits with the loss over them."""
    cfg = {
        "models": [
            {"name": "a", "source": {"hub": "x/a"}, "max_length": 16},
            {"name": "b", "source": {"hub": "x/b"}, "max_length": 16},
            {"name": "v", "source": {"hub": "x/v"}, "max_length": 16},
        ],  # fmt: skip
        "corpora": {"c": {"kind": "conllu", "path": "none"}},
        "analysis": {
            "ablation": {"exact_max_heads": 50, "check_heads": 2, "exact_jobs": 1},
            "clark_surface": {"clustering": {}},
        },
    }
    hints = {"a": Shape(4, 4, 4, 64, 16, 1e6), "b": Shape(4, 8, 8, 128, 16, 2e6),
             "v": Shape(4, 4, 4, 64, 16, 1.2e6, body=1e6, vocab=1000)}  # fmt: skip
    feats = plan.Features(cfg, ".", hints)
    feats._stats["c"] = plan.CorpusStats(3, [4, 8, 100])  # lengths 8, 13 and 16 (cut at max_length) tokens
    job = Job("clark_js_distances", {"model": "a", "corpus": "c"})
    fa, fb = feats.job(job), feats.job(Job("clark_js_distances", {"model": "b", "corpus": "c"}))
    assert fa["PT"] == 1e6 * (8 + 13 + 16) and fa["attn"] == 16 * 16 * (64 + 169 + 256)
    assert fb["LHT"] == 2 * fa["LHT"] and fb["LH2N"] == 4 * fa["LH2N"] == 4 * 16**2 * 3
    ta = 16 * 36 + 200 * 24
    pa, pb = 1e6 * 5 / 8, 2e6 * 5 / 8  # one exact pass: the layers from the head's on (no vocabulary: no logits)
    assert feats.job(Job("ablation_exact", {"model": "a"}))["abl"] == 16 * pa * ta  # 16 heads <= 50: exact
    assert feats.job(Job("ablation_exact", {"model": "b"}))["abl"] == 32 * pb * ta
    logits = 1000 * (64 + plan.LOSS_MADDS_PER_LOGIT)  # the output layer and the loss over its logits
    assert feats.job(Job("ablation_exact", {"model": "v"}))["abl"] == 16 * (pa + logits) * ta
    cfg["analysis"]["ablation"]["exact_jobs"] = 2  # the forwards split over two jobs
    assert plan.Features(cfg, ".", hints).job(Job("ablation_exact", {"model": "b"}))["abl"] == 16 * pb * ta
    cfg["analysis"]["ablation"]["exact_jobs"] = 1
    assert "abl_other" not in feats.job(Job("ablation_exact", {"model": "b"}))  # every head exact: no other way
    cfg["analysis"]["ablation"]["exact_max_heads"] = 20  # 32 heads > 20: checked estimates, L * check_heads + 4
    checked = plan.Features(cfg, ".", hints).job(Job("ablation_exact", {"model": "b"}))
    assert checked["abl"] == (4 * 2 + 4) * pb * ta
    assert checked["abl_other"] == 32 * pb * ta  # if every layer failed its check: every head exact
    cfg["analysis"]["ablation"]["on_check_fail"] = "unreliable"  # failing layers add no exact heads
    assert "abl_other" not in plan.Features(cfg, ".", hints).job(Job("ablation_exact", {"model": "b"}))


def test_features_of_the_icl_quiet_and_long_input_rules():
    """By hand: the ICL prompts' tokens and patched forwards, the exclusion test's evaluations, the zero-ablation's
    forwards, the quiet statistics' inputs, and long inputs (needles, repeated blocks, long corpora) counted in the
    map-free term, never in the eager one."""
    cfg = {
        "models": [{"name": "a", "source": {"hub": "x/a"}, "max_length": 128}],
        "corpora": {"long": {"kind": "wikitext_long", "path": "none", "tokens": 1000}},
        "analysis": {
            "icl": {
                "tasks": ["t1", "t2"],
                "n_prompts": 3,
                "shots": 4,
                "exact_max_heads": 50,
                "check_heads": 2,
                "exclusion": {"random_sets": 5, "n_texts": 2, "late": 500},
            },  # fmt: skip
            "quiet": {
                "corpora": ["c1", "c2"],
                "n_sequences": 10,
                "length": 32,
                "ablation_sequences": 8,
                "exact_max_heads": 8,
                "check_heads": 1,
            },  # fmt: skip
            "circuits": {
                "long": {"lengths": [100, 400], "depths": [0.5], "needles": 2, "block_lengths": [50], "blocks": 3},
                "induction": {"n_sequences": 2, "random_sets": 1},
            },  # fmt: skip
            "detectors": {"long": {"n_sequences": 2}},
        },
    }
    shape = Shape(4, 4, 4, 64, 16, 1e6)  # 16 heads; no vocabulary: the logits cost nothing extra
    pa = 1e6 * 5 / 8  # one patched or ablated pass: the layers from the head's own on
    feats = plan.Features(cfg, ".", {"a": shape})
    tokens = 2 * 3 * (4 + 1) * plan.ICL_PAIR_TOKENS  # tasks x prompts x (shots + 1) demonstrations
    icl = feats.job(Job("icl_heads", {"model": "a"}))
    assert icl["PT"] == pytest.approx(1e6 * 2 * tokens) and icl["abl"] == pytest.approx(16 * pa * tokens)
    runs = 2 + 2 * (1 + 5)
    late = 127  # token 500 cut to max_length - 1
    assert feats.job(Job("icl_exclusion", {"model": "a"}))["PTabl"] == pytest.approx(
        runs * (1e6 * tokens + 1e6 * 2 * (late + 1))
    )
    assert "abl_other" not in icl  # 16 heads <= 50: every head patched exactly
    # the zero-ablation: every head exact (on_check_fail: exact), else the checked heads (16 > 8 heads); planned as
    # if every layer failed its check, and the other way if every layer passed it
    zero = feats.job(Job("quiet_ablation", {"model": "a"}))
    assert zero["abl"] == 16 * pa * 8 * 32 and zero["abl_other"] == (4 * 1 + 4) * pa * 8 * 32
    cfg["analysis"]["quiet"]["on_check_fail"] = "unreliable"
    zero = plan.Features(cfg, ".", {"a": shape}).job(Job("quiet_ablation", {"model": "a"}))
    assert zero["abl"] == (4 * 1 + 4) * pa * 8 * 32 and "abl_other" not in zero
    cfg["analysis"]["icl"]["exact_max_heads"] = 8  # checked patching: every head if every layer failed its check
    icl = plan.Features(cfg, ".", {"a": shape}).job(Job("icl_heads", {"model": "a"}))
    assert icl["abl"] == pytest.approx((4 * 2 + 4) * pa * tokens) and icl["abl_other"] == pytest.approx(
        16 * pa * tokens
    )
    quiet = feats.job(Job("quiet", {"model": "a"}))
    assert quiet["PT"] == 1e6 * 2 * 10 * 32 and quiet["attn"] == 16 * 16 * 2 * 10 * 32**2 and quiet["attn_free"] == 0
    circ = feats.job(Job("circuits_causal", {"model": "a"}))
    assert circ["attn"] == 16 * 16 * 2 * 2 * 64**2  # the induction check's sequences only
    assert circ["attn_free"] == 16 * 16 * (2 * (100**2 + 400**2) + 3 * 100**2)
    assert circ["PT"] == 1e6 * (2 * 2 * 64 + 2 * 500 + 3 * 100) and circ["LHn2"] == 16 * 64**2
    encoder = plan.Features(cfg, ".", {"a": Shape(4, 4, 4, 64, 16, 1e6, decoder=False)})
    for rule in ("icl_heads", "icl_exclusion", "quiet_ablation"):  # skipped rows: start-up only
        assert encoder.job(Job(rule, {"model": "a"})) == {"one": 1.0}
    assert not plan.shape_from_config(plan.BUILTIN_SHAPES["google-bert/bert-base-uncased"]).decoder
    assert plan.shape_from_config(plan.BUILTIN_SHAPES["qwen2.5-coder-0.5b"]).decoder
    feats._stats["long"] = plan.CorpusStats(3, [700, 700, 700])  # three segments; the detectors read two
    lengths = feats.stats("long").tokens(1000)[:2]
    long = feats.job(Job("detectors_long", {"model": "a", "corpus": "long"}))
    assert long["attn_free"] == pytest.approx(16 * 16 * (lengths**2).sum()) and long["PT"] == 1e6 * lengths.sum()


def test_memory_features_by_hand():
    """The weights each rule holds, the logits of one batched exact pass, and what a backward pass keeps, by hand for
    a 2-layer model: 4 heads, d 8, d_ff 16, vocabulary 50, 1400 parameters (600 in the body, untied output layer),
    bfloat16 in the config."""
    shape = Shape(2, 4, 4, 8, 2, 1400.0, 600.0, 50, True, 16)
    assert shape.ff == 16 and Shape(4, 4, 4, 64, 16, 1e6).ff == 4 * 64
    assert plan.shape_from_config(plan.BUILTIN_SHAPES["qwen2.5-coder-0.5b"]).ff == 4864
    cfg = {
        "models": [{"name": "a", "source": {"hub": "x/a"}, "max_length": 16, "dtype": "bfloat16"}],
        "corpora": {},
        "analysis": {
            "ablation": {"lm_sequences": 3, "lm_max_tokens": 10, "batch_size": 2, "exact_max_rows": 50,
                         "exact_max_heads": 4, "check_heads": 1, "exact_jobs": 1},
            "quiet": {"corpora": ["c1"], "n_sequences": 10, "length": 8, "ablation_sequences": 3, "batch_size": 2,
                      "exact_max_rows": 40},
            "icl": {"tasks": ["t1", "t2"], "n_prompts": 3, "shots": 4, "batch_size": 4},
            "clark_surface": {"gradients": {"n_segments": 3, "batch_size": 2}},
        },
    }  # fmt: skip
    feats = plan.Features(cfg, ".", {"a": shape})

    def job(rule):
        return feats.job(Job(rule, {"model": "a"}))

    # weights: the config's dtype (2 bytes); float32 with the LM head (circuits_causal: its base model, no copy)
    assert job("extract_attention")["Pbytes"] == 1400 * 2 and job("detectors")["Pbytes"] == 1400 * 2
    assert job("ablation_exact")["Pbytes"] == job("icl_heads")["Pbytes"] == 1400 * 4
    assert job("circuits_causal")["Pbytes"] == 1400 * 4
    # exact ablation: 8 heads > 4, so L * 1 + 4 = 6 checked forwards; batches of 2 x 10 tokens, 50 // 20 = 2 heads
    # a pass: 40 rows of logits; the estimate's backward pass over one batch of 20 tokens
    abl = job("ablation_exact")
    assert abl["Rlogits"] == 40 * 50 * 4
    assert abl["Gact"] == 4 * 2 * 20 * (8 + 16 + 4 * 10) and abl["Glogits"] == 4 * 20 * 50
    cfg["analysis"]["ablation"]["exact_max_heads"] = 8  # every head exact: no estimate, no backward pass
    exact = plan.Features(cfg, ".", {"a": shape}).job(Job("ablation_exact", {"model": "a"}))
    assert exact["Rlogits"] == 40 * 50 * 4 and exact["Gact"] == exact["Glogits"] == 0
    cfg["analysis"]["ablation"]["exact_max_rows"] = 1000  # 50 heads a pass, but the job has only 8
    assert plan.Features(cfg, ".", {"a": shape}).job(Job("ablation_exact", {"model": "a"}))["Rlogits"] == (
        8 * 20 * 50 * 4
    )
    encoder = plan.Features(cfg, ".", {"a": Shape(2, 4, 4, 8, 2, 1400.0, 600.0, 50, False, 16)})
    assert encoder.job(Job("circuits_causal", {"model": "a"}))["Pbytes"] == 0  # no causal model: nothing loaded
    assert {k: encoder.job(Job("ablation_exact", {"model": "a"}))[k] for k in ("Rlogits", "Gact", "Glogits")} == {
        "Rlogits": 0.0, "Gact": 0.0, "Glogits": 0.0}  # fmt: skip
    # zero-ablation: every head exact (8 forwards); batches of 2 inputs x 8 tokens, 40 // 16 = 2 heads a pass
    quiet = job("quiet_ablation")
    assert quiet["Rlogits"] == 2 * 16 * 50 * 4
    assert quiet["Gact"] == 4 * 2 * 16 * (8 + 16 + 4 * 8) and quiet["Glogits"] == 4 * 16 * 50
    # ICL: 6 prompts of (4 + 1) x 8.8 tokens, a batch of 4; only the last position's logits
    n = 5 * plan.ICL_PAIR_TOKENS
    icl = job("icl_heads")
    assert icl["Gact"] == pytest.approx(4 * 2 * 4 * n * (8 + 16 + 4 * n)) and icl["Glogits"] == 4 * 4 * 50
    assert "Gact" not in job("icl_exclusion") and "Rlogits" not in job("icl_heads")
    # gradients: batches of 2 segments of min(max_length 16, 135) tokens, every position's logits
    grad = job("clark_gradients")
    assert grad["Gact"] == 4 * 2 * 32 * (8 + 16 + 4 * 16) and grad["Glogits"] == 4 * 32 * 50


def test_model_weights_mb_by_dtype_and_unknown_models():
    models = {"l8": {"source": {"hub": "meta-llama/Meta-Llama-3-8B"}},
              "l8bf": {"source": {"hub": "meta-llama/Meta-Llama-3-8B"}, "dtype": "bfloat16"},
              "who": {"source": {"hub": "nobody/unknown-model"}}}  # fmt: skip
    params = plan.model_shape("l8", models).params
    assert 8.0e9 < params < 8.1e9  # Llama-3-8B: 8.03e9 parameters
    assert plan.model_weights_mb("l8", models) == int(params * 4 / 1e6)
    assert plan.model_weights_mb("l8bf", models) == int(params * 2 / 1e6)
    assert plan.model_weights_mb("who", models) == 0  # no shape known before it is downloaded


def test_measured_reads_the_cost_record_then_the_benchmark(tmp_path):
    job = Job("r", log="logs/r.log", benchmark="results/benchmarks/r.tsv", outputs=["out.bin"])
    assert plan.measured(job, tmp_path) is None
    (tmp_path / "results" / "benchmarks").mkdir(parents=True)
    (tmp_path / "results" / "benchmarks" / "r.tsv").write_text(
        "s\th:m:s\tmax_rss\tcpu_time\n2.5\t0:00:02\t100.0\t4.0\n"
    )
    (tmp_path / "out.bin").write_bytes(b"x" * 10)
    assert plan.measured(job, tmp_path) == {"cpu_s": 4.0, "peak_rss_bytes": 100 * 2**20, "output_bytes": 10.0,
                                            "wall_s": 2.5}  # fmt: skip
    (tmp_path / "logs").mkdir()
    rec = {"cpu_s": 7.0, "peak_rss_bytes": 5.0, "output_bytes": 3.0, "wall_s": 8.0, "failed": None}
    (tmp_path / "logs" / "r.log.cost.json").write_text(json.dumps(rec))
    assert plan.measured(job, tmp_path)["cpu_s"] == 7.0
    (tmp_path / "logs" / "r.log.cost.json").write_text(json.dumps(dict(rec, failed="ValueError")))
    assert plan.measured(job, tmp_path) is None  # a failed job measures nothing


def test_memory_warning_names_rule_and_both_numbers(tmp_path):
    model = tmp_path / "cost.json"
    model.write_text(json.dumps({"rules": {"extract_attention": {"peak_rss_bytes": {"one": 5e8, "Pbytes": 1.0}},
                                           "atlas": {"peak_rss_bytes": {"one": 9e12}}}}))  # fmt: skip
    cfg = {"models": [], "corpora": {}}
    models = {"big": {"name": "big", "source": {"hub": "meta-llama/Meta-Llama-3-70B"}, "max_length": 128},
              "small": {"name": "small", "source": {"hub": "openai-community/gpt2"}, "max_length": 128}}  # fmt: skip
    warnings = plan.memory_warnings(cfg, models, limit_mb=24000, model_path=model)
    assert len(warnings) == 1  # the 70B model's extraction; gpt2 fits; atlas runs no model
    assert "rule extract_attention on model big" in warnings[0]
    assert "282.7 GB exceeds the 24.0 GB" in warnings[0], warnings[0]
    assert plan.memory_warnings(cfg, models, 24000, model_path=tmp_path / "none.json") == []
    # a model the run gives no corpus (or an analysis leaves out) gets no warning for its rules
    assert plan.memory_warnings(cfg, models, 24000, model_path=model, runs=lambda key, m: m != "big") == []
    rules = json.loads(model.read_text())
    rules["rules"]["quiet_ablation"] = {"peak_rss_bytes": {"one": 9e12}}
    model.write_text(json.dumps(rules))
    both = plan.memory_warnings(cfg, models, 24000, model_path=model)
    assert [w.split(":")[0] for w in both] == ["rule extract_attention on model big", "rule quiet_ablation on model big",
                                               "rule quiet_ablation on model small"]  # fmt: skip
    # the quiet heads' analysis covers 'small' only: extraction asks with no analysis key
    asked = []
    covers = lambda key, m: asked.append(key) or key is None or m == "small"  # noqa: E731
    only = plan.memory_warnings(cfg, models, 24000, model_path=model, runs=covers)
    assert [w.split(":")[0] for w in only] == [
        "rule extract_attention on model big",
        "rule quiet_ablation on model small",
    ]
    assert set(asked) == {None, "quiet"}
    # a rule's own memory features: circuits_causal holds the LM model in float32, whatever the config's dtype
    model.write_text(json.dumps({"rules": {"circuits_causal": {"peak_rss_bytes": {"Pbytes": 1.0}}}}))
    bf16 = {"big": dict(models["big"], dtype="bfloat16")}
    s = plan.model_shape("big", bf16)
    (w,) = plan.memory_warnings(cfg, bf16, 24000, model_path=model)
    assert f"predicted peak memory {s.params * 4 / 1e9:.1f} GB" in w, w


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_plan")
    subprocess.run([sys.executable, str(REPO / "tests" / "tiny_workflow.py"), "build", str(out), "--limit", "3"],
                   check=True, capture_output=True)  # fmt: skip
    (out / "resources").symlink_to(REPO / "resources")
    return out


def test_cli_plan_on_the_tiny_config(tiny_run, tmp_path, capsys):
    """Every job of the tiny config's dry run, each measured at 10 CPU-s: the fitted model predicts 10 s a job,
    and `headatlas plan` prints each rule, the total (10 s x jobs) and what dominates."""
    from headatlas.cli import main

    config = str(tiny_run / "config.yaml")
    cfg = plan.load_config(config)
    jobs = plan.dry_run_jobs(config, tiny_run)
    assert {"extract_attention", "ablation_exact", "clark_js_distances", "jomyaeng_probe"} <= {
        j.family_rule for j in jobs}  # fmt: skip
    feats = plan.Features(cfg, tiny_run)
    rows = [(j, feats.job(j), {"cpu_s": 10.0, "peak_rss_bytes": 2e9, "output_bytes": 1e6}) for j in jobs]
    cost = tmp_path / "cost.json"
    plan.save_model(plan.fit(rows), [{"models": ["tinybert", "tinygpt2"]}], cost)
    args = ["plan", "--configfile", config, "--directory", str(tiny_run), "--cost-model", str(cost)]
    assert main(args + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["total"]["jobs"] == len(jobs) and summary["total"]["unknown"] == 0
    assert summary["total"]["cpu_s"] == pytest.approx(10.0 * len(jobs), rel=1e-6)
    assert main(args + ["--cores", "2", "--memory", "1"]) == 0
    text = capsys.readouterr().out
    assert f"{len(jobs)} jobs" in text and "EXCEEDS 1 GB" in text and "dominated by:" in text
    assert f"wall on 2 core(s): at least {10 * len(jobs) / 2 / 60:.1f} min" in text
    assert main(["plan", "--configfile", str(tmp_path / "missing.yaml"), "--cost-model", str(cost)]) == 1


def test_feature_keys_name_the_rules_own_section():
    """What dominates a rule is said with the keys of its own section (the zero-ablation's are the quiet heads',
    not the exact ablation's); a term no rule overrides keeps its general keys."""
    assert "analysis.quiet.ablation_sequences" in plan.feature_keys("quiet_ablation", "abl")
    assert "analysis.icl.tasks" in plan.feature_keys("icl_heads", "abl")
    assert "analysis.icl.exclusion.random_sets" in plan.feature_keys("icl_exclusion", "PTabl")
    assert plan.feature_keys("ablation_exact", "abl") == plan.FEATURE_KEYS["abl"]
    for rule, term in plan.RULE_FEATURE_KEYS:
        assert term in plan.FAMILIES[plan.family(rule)]  # a term the rule's formula has


def test_cli_check_compares_a_finished_run_with_the_stored_model(tiny_run, tmp_path, capsys):
    """`plan check` predicts a run's measured jobs with the stored coefficients (no refit): three jobs measured at
    twice the CPU the model predicts show as -50% per rule and in the total, with their peaks."""
    from headatlas.core.runner import cost_record_path

    config = str(tiny_run / "config.yaml")
    jobs = [j for j in plan.dry_run_jobs(config, tiny_run) if j.log]
    feats = plan.Features(plan.load_config(config), tiny_run)
    rows = [(j, feats.job(j), {"cpu_s": 10.0, "peak_rss_bytes": 2e9, "output_bytes": 1e6}) for j in jobs]
    cost = tmp_path / "cost.json"
    plan.save_model(plan.fit(rows), [], cost)
    done = [j for j in jobs if j.family_rule == "extract_attention"][:2] + [
        j for j in jobs if j.family_rule == "atlas"][:1]  # fmt: skip
    records = [tiny_run / cost_record_path(j.log) for j in done]
    try:
        for path in records:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"cpu_s": 20.0, "peak_rss_bytes": 3e9, "output_bytes": 1.0, "wall_s": 5.0}))
        out = tmp_path / "check.json"
        assert plan.main(["check", f"{tiny_run}:config.yaml", "--cost-model", str(cost), "--out", str(out)]) == 0
    finally:
        for path in records:
            path.unlink(missing_ok=True)
    result = json.loads(out.read_text())
    assert set(result["rules"]) == {"extract_attention", "atlas"}
    ext = result["rules"]["extract_attention"]
    assert ext["measured"] == 40.0 and ext["predicted"] == pytest.approx(20.0, rel=1e-6)
    assert ext["error"] == pytest.approx(-0.5) and ext["peak_measured"] == 3e9 and ext["jobs"] == 2
    assert ext["wall_measured"] == 10.0 and ext["disk_measured"] == 2.0
    assert ext["disk_predicted"] == pytest.approx(2e6, rel=1e-6)
    # the weights enter each job's peak at their own size: the two tiny models' differ by kilobytes
    assert ext["peak_predicted"] == pytest.approx(2e9, rel=1e-4)
    assert result["total"]["error"] == pytest.approx(-0.5)
    assert "extract_attention" in capsys.readouterr().out
    # --record stores the comparison's accuracy for the named targets in the cost model, naming the run
    for path in records:
        path.write_text(json.dumps({"cpu_s": 20.0, "peak_rss_bytes": 3e9, "output_bytes": 1.0, "wall_s": 5.0}))
    try:
        args = ["check", f"{tiny_run}:config.yaml", "--cost-model", str(cost), "--record", "cpu_s"]
        assert plan.main(args) == 0
    finally:
        for path in records:
            path.unlink(missing_ok=True)
    recorded = json.loads(cost.read_text())["accuracy"]
    assert set(recorded) == {"cpu_s"} and recorded["cpu_s"]["total"] == pytest.approx(-0.5)
    assert (
        recorded["cpu_s"]["on"].startswith("a run the fit did not see: ")
        and "config.yaml, 3 jobs" in recorded["cpu_s"]["on"]
    )
    with pytest.raises(SystemExit):
        plan.main(args[:-1] + ["cpu"])


def test_composition_and_js_bounds_in_the_features():
    """Composition's work as it loops, by hand (3 layers x 2 heads: 4 writers, one block; 12 causal pairs, 8 at most
    one layer apart), and the JS distances' head sample above ``clustering.max_heads`` (as many per layer)."""
    c = plan.composition_counts(3, 2, 4, None, 4.0)
    assert (c["builds"], c["blocks"], c["pairs"]) == (4 + 3 * 2 * 2, 1, 12)
    assert plan.composition_counts(3, 2, 4, 1, 4.0)["pairs"] == 8
    tight = plan.composition_counts(3, 2, 4, None, 1e-9)  # two Grams at a time: one writer per block
    assert tight["blocks"] == 4 and tight["builds"] > c["builds"]
    assert plan.composition_work(c, 4, 2) == pytest.approx(
        16 * 4**2 * 2 * plan.GRAM_BUILD_S / plan.PAIR_PRODUCT_S + 3 * 12 * 4 * 5 / 2
    )
    cfg = {
        "models": [{"name": "big", "source": {"hub": "x/big"}, "max_length": 16}],
        "corpora": {"c": {"kind": "conllu", "path": "none"}},
        "analysis": {
            "clark_surface": {"clustering": {"max_heads": 512, "n_segments": 200}},
            "circuits": {"composition": {"max_layer_gap": 2}},
        },  # fmt: skip
    }
    feats = plan.Features(cfg, ".", {"big": Shape(10, 60, 60, 64, 8, 1e6)})  # 600 heads > 512
    feats._stats["c"] = plan.CorpusStats(3, [4, 8, 100])
    f = feats.job(Job("clark_js_distances", {"model": "big", "corpus": "c"}))
    assert f["LH2N"] == (10 * 51) ** 2 * 3  # 51 heads per layer, 3 sequences
    gap = plan.composition_counts(10, 60, 64, 2, 4.0)
    assert f["LH2"] == plan.composition_work(gap, 64, 8)


def test_disk_features_of_word_maps_and_representations():
    """An extraction's stored bytes beyond its tables, by hand: Clark's word-level maps on the probes' corpora (every
    head, the lower triangle of u words for a decoder, u x u for an encoder) and one representation per sequence of
    every layer where the corpus keeps them (the hidden state and every head's output), float32."""
    cfg = {
        "models": [{"name": "dec", "source": {"hub": "x/dec"}, "max_length": 16},
                   {"name": "enc", "source": {"hub": "x/enc"}, "max_length": 16}],
        "corpora": {"train": {"kind": "conllu", "path": "none", "reps": False},
                    "probe": {"kind": "records", "path": "none"},
                    "other": {"kind": "conllu", "path": "none", "reps": False}},
        "analysis": {"clark_syntax": {"probe_train": "train", "probe_eval": {"dev": "other"}, "models": ["dec", "enc"]}},
    }  # fmt: skip
    shapes = {"dec": Shape(2, 3, 3, 12, 4, 1e6), "enc": Shape(2, 3, 3, 12, 4, 1e6, decoder=False)}
    feats = plan.Features(cfg, ".", shapes)
    feats._stats.update(train=plan.CorpusStats(2, [3, 20]), probe=plan.CorpusStats(5, [4] * 5),
                        other=plan.CorpusStats(1, [2]))  # fmt: skip

    def stored(model, corpus):
        f = feats.job(Job("extract_attention", {"model": model, "corpus": corpus}))
        return f["wordmaps"], f["reps"]

    # 2 layers x 3 heads; words cut at max_length 16: 3 -> 6 cells, 16 -> 136 (decoder), 9 and 256 (encoder)
    assert stored("dec", "train") == (4.0 * 6 * (6 + 136), 0.0)
    assert stored("enc", "train") == (4.0 * 6 * (9 + 256), 0.0)
    assert stored("dec", "other") == (4.0 * 6 * 3, 0.0)  # an evaluation corpus of the probes
    assert stored("dec", "probe") == (0.0, 4.0 * 2 * (12 + 3 * 4) * 5)  # reps by default, no word maps
    cfg["analysis"]["clark_syntax"]["models"] = ["enc"]  # the analysis leaves the decoder out: no word maps
    assert stored("dec", "train") == (0.0, 0.0) and stored("enc", "train")[0] > 0
    assert "wordmaps" in plan.features_for("extract_attention", "output_bytes")
