"""The interactive atlas page (headatlas.atlas.page, rule atlas_page).

Data building without a browser (values equal the TSV, CIs, ranks, roles, typical sentences,
example maps equal the store's word-level maps, stores without maps), then the page itself in
headless Chromium (Debian's ``chromium`` driven by playwright; never a downloaded browser):
a hand-made run (fast) and the tiny workflow run (slow). The browser tests are skipped only
when chromium or playwright is absent; screenshots go to ``$HEADATLAS_ARTIFACTS`` (default
``results/ci-artifacts/atlas_page/`` in the repository).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from headatlas.atlas import columns as registry
from headatlas.atlas import page as pg
from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record, TokenizedRecord, write_records
from headatlas.core.store import AttentionStore, AttentionWriter, word_level

L, H = 2, 3
WORDS = [
    ("the", "cat", "sat", "down", "here"),
    ("a", "dog", "ran"),  # too short for the pool (min_words 4)
    ("we", "saw", "the", "big", "red", "bus"),
    ("it", "was", "very", "cold", "today"),
]


def _tokenized(words: tuple[str, ...], index: int) -> TokenizedRecord:
    """[CLS] words [SEP], the first word split into two pieces."""
    pieces = ["[CLS]", words[0][:1], "##" + words[0][1:]] + list(words[1:]) + ["[SEP]"]
    word = [-1, 0, 0] + list(range(1, len(words))) + [-1]
    special = [SPECIAL_CLS] + [SPECIAL_NONE] * (len(pieces) - 2) + [SPECIAL_SEP]
    n = len(pieces)
    return TokenizedRecord(index, tuple(range(n)), tuple(pieces), tuple(word), tuple(special), (0,) * n, len(words))


def _maps(rng, n: int) -> np.ndarray:
    a = rng.random((H, n, n)).astype(np.float32) + 1e-3
    return a / a.sum(-1, keepdims=True)


def _atlas() -> pd.DataFrame:
    layer, head = np.divmod(np.arange(L * H), H)
    df = pd.DataFrame(
        {"model": "m", "layer": layer, "head": head, "label": [f"{a + 1}-{b + 1}" for a, b in zip(layer, head)]}
    )
    df["clark_behaviour"] = ["broad", "next", "other", "prev", "broad", "sep"]
    df["clark_entropy"] = [1.5, 2.25, np.nan, 0.125, 3.0, 2.0]
    df["pande_local_effect"] = [2.0, 0.5, 1.5, 0.25, 3.5, 0.75]
    df["pande_syntactic_effect"] = [1.25, 1.75, 0.5, 2.5, 0.5, 0.125]
    df["pande_local_sig_faithful"] = [True, False, True, False, True, True]
    df["pande_syntactic_sig_faithful"] = [True, True, False, True, False, False]
    df["pande_local_sig_fdr"] = [True, False, False, False, True, False]
    df["pande_syntactic_sig_fdr"] = [True, True, False, True, False, False]
    df["pande_local_effect_ci_low"] = df["pande_local_effect"] - 0.125
    df["pande_local_effect_ci_high"] = df["pande_local_effect"] + 0.25
    df["det_kv_group"] = [0, 0, 1, 0, 0, 1]
    df["detector_score"] = [0.1, -0.2, 0.3, np.nan, 0.05, -0.4]  # an unknown column: generic
    return df


@pytest.fixture
def run(tmp_path):
    """A hand-made run: an atlas, agreement table, a store of 4 sentences, its corpus and
    Pande sentence scores (roles local, syntactic)."""
    rng = np.random.default_rng(0)
    records = [Record(id=f"r{i}", words=w, segment=(0,) * len(w)) for i, w in enumerate(WORDS)]
    corpus = tmp_path / "corpus.jsonl.gz"
    write_records(records, corpus)
    tok = [_tokenized(w, i) for i, w in enumerate(WORDS)]
    maps = [[_maps(rng, len(t)) for t in tok] for _ in range(L)]
    store = tmp_path / "store"
    with AttentionWriter(
        store, tok, [r.id for r in records], L, H, meta={"model": "m", "corpus": "c", "model_kind": "encoder"}
    ) as w:
        for k in range(len(tok)):
            for layer in range(L):
                w.write(k, layer, maps[layer][k])
    scores = np.zeros((len(WORDS), L, H, 2), np.float32)
    scores[..., 0] = [[[1, 2, 3], [4, 5, 6]], [[9, 9, 9], [9, 9, 9]], [[3, 1, 1], [1, 1, 9]], [[2, 2, 2], [2, 8, 2]]]
    scores[..., 1] = np.arange(len(WORDS))[:, None, None][::-1] + np.zeros((len(WORDS), L, H))
    scores_path = tmp_path / "scores.h5"
    with h5py.File(scores_path, "w") as f:
        f["scores"] = scores
        f["roles"] = np.array(["local", "syntactic"], dtype=object).astype("S")
        f.create_dataset("record_id", data=np.array([r.id for r in records], dtype=object), dtype=h5py.string_dtype())
    atlas_path = tmp_path / "atlas.tsv"
    _atlas().to_csv(atlas_path, sep="\t", index=False, float_format="%.6g")
    agreement = pd.DataFrame(
        [{"model": "m", "method_a": "clark_syntax", "method_b": "pande_syntactic", "n_heads": 6, "spearman": 0.5,
          "ci_low": 0.1, "ci_high": 0.8, "p": 0.3, "top_k": 3, "top_k_overlap": 2, "top_k_jaccard": 0.5, "top_k_chance": 1.5},
         {"model": "m", "method_a": "clark_syntax", "method_b": "jm_syntactic", "n_heads": 6, "spearman": np.nan,
          "ci_low": np.nan, "ci_high": np.nan, "p": np.nan, "top_k": 3, "top_k_overlap": 0, "top_k_jaccard": np.nan, "top_k_chance": np.nan}]
    )  # fmt: skip
    agreement_path = tmp_path / "agreement.tsv"
    agreement.to_csv(agreement_path, sep="\t", index=False)
    return {"atlas": atlas_path, "agreement": agreement_path, "store": store, "corpus": corpus, "scores": scores_path,
            "maps": maps, "tmp": tmp_path}  # fmt: skip


SETTINGS = pg.PageSettings(corpus="c", examples=1, pool=3, min_words=4, max_words=10)


def _sources(run, stores=True, scores=True, models=("m",)):
    return {
        m: {"atlas": str(run["atlas"]), "agreement": str(run["agreement"]),
            "stores": [str(run["store"])] if stores else [], "scores": str(run["scores"]) if scores else None}
        for m in models
    }  # fmt: skip


# --- data building --------------------------------------------------------------------------


def test_values_equal_the_tsv(run):
    atlas = pd.read_csv(run["atlas"], sep="\t")
    d = pg.model_data("m", atlas, None)
    assert (d["n_layers"], d["n_heads"]) == (L, H)
    assert d["labels"] == ["1-1", "1-2", "1-3", "2-1", "2-2", "2-3"]
    kinds = {c["name"]: c["kind"] for c in d["columns"]}
    assert kinds["clark_behaviour"] == "text" and kinds["pande_local_sig_fdr"] == "bool"
    assert kinds["clark_entropy"] == kinds["detector_score"] == kinds["det_kv_group"] == "number"
    assert set(kinds) == set(atlas.columns) - {"model", "layer", "head", "label"}
    for c in kinds:
        for i, v in enumerate(d["values"][c]):
            want = atlas[c].iloc[i]
            if pd.isna(want):
                assert v is None
            elif kinds[c] == "bool":
                assert v is bool(want)
            else:
                assert v == want, (c, i)
    assert d["values"]["clark_entropy"][2] is None and d["values"]["clark_entropy"][3] == 0.125


def test_rows_come_in_layer_major_order_whatever_the_tsv_order(run):
    atlas = pd.read_csv(run["atlas"], sep="\t")
    d = pg.model_data("m", atlas.iloc[::-1], None)
    assert d["values"]["pande_local_effect"] == [2.0, 0.5, 1.5, 0.25, 3.5, 0.75]
    with pytest.raises(ValueError, match="not one per head"):
        pg.model_data("m", atlas.iloc[1:], None)


def test_ci_columns_roles_and_descriptions(run):
    d = pg.model_data("m", pd.read_csv(run["atlas"], sep="\t"), None)
    cols = {c["name"]: c for c in d["columns"]}
    assert cols["pande_local_effect"]["ci"] == ["pande_local_effect_ci_low", "pande_local_effect_ci_high"]
    assert cols["pande_local_effect_ci_low"]["ci_of"] == "pande_local_effect"
    assert "ci" not in cols["pande_syntactic_effect"]
    assert d["roles"] == [
        {"role": "pande_local", "faithful": "pande_local_sig_faithful", "fdr": "pande_local_sig_fdr"},
        {"role": "pande_syntactic", "faithful": "pande_syntactic_sig_faithful", "fdr": "pande_syntactic_sig_fdr"},
    ]
    assert registry.describe("pande_syntactic_nsubj_effect").desc.startswith(
        "Pande sieve effect of role syntactic_nsubj"
    )
    assert registry.describe("probe_syntactic_mean_acc").desc.startswith(
        "Jo & Myaeng mean probing accuracy over the syntactic"
    )
    assert registry.describe("detector_score").desc == "detector_score"  # unknown: its name
    assert not registry.describe("detector_score").known
    assert registry.describe("x_ci_high").desc == "high end of the CI of x"
    assert cols["clark_entropy"]["unit"] == "nats" and cols["clark_entropy"]["family"] == "Clark et al. (surface)"
    assert cols["det_kv_group"]["family"] == "detectors"


def test_rank_hand_computed():
    r = pg.rank_desc(np.array([0.5, 2.0, np.nan, 2.0, -1.0]))
    np.testing.assert_array_equal(r, [3, 1, np.nan, 1, 4])


def test_agreement_rows_keep_their_numbers_and_missing_ones_are_null(run):
    d = pg.model_data("m", pd.read_csv(run["atlas"], sep="\t"), pd.read_csv(run["agreement"], sep="\t"))
    assert d["agreement"][0]["spearman"] == 0.5 and d["agreement"][0]["top_k_overlap"] == 2
    assert d["agreement"][1]["spearman"] is None
    json.dumps(d, allow_nan=False)


def test_head_roles_put_held_roles_first_then_by_effect():
    roles = pg.head_roles(_atlas(), ["local", "syntactic"])
    # 1-1 holds both (effects 2.0, 1.25); 1-2 holds syntactic only; 1-3 holds none (local 1.5 > 0.5)
    assert roles == [
        [("local", True), ("syntactic", True)],
        [("syntactic", True), ("local", False)],
        [("local", False), ("syntactic", False)],
        [("syntactic", True), ("local", False)],
        [("local", True), ("syntactic", False)],
        [("local", False), ("syntactic", False)],
    ]
    assert pg.head_roles(_atlas(), ["block"]) == [[]] * 6


def test_typical_sentence_is_the_pool_sentence_with_the_highest_score():
    scores = np.zeros((3, 1, 2, 2))
    scores[:, 0, 0, 0] = [1.0, 4.0, 2.0]  # head 1-1, local: pool sentence 1
    scores[:, 0, 1, 1] = [np.nan, 0.5, 3.0]  # head 1-2, syntactic: sentence 2 (NaN skipped)
    t = pg.typical_sentences(scores, ["local", "syntactic"], [[("local", True)], [("syntactic", False)]])
    assert t == [
        {"role": "local", "held": True, "s": 1, "score": 4.0},
        {"role": "syntactic", "held": False, "s": 2, "score": 3.0},
    ]
    # a held role without any score on the pool (block on single sentences) gives way to the next candidate
    scores[:, 0, :, 1] = np.nan
    t = pg.typical_sentences(scores, ["local", "block"], [[("block", True), ("local", False)], [("block", True)]])
    assert t == [{"role": "local", "held": False, "s": 1, "score": 4.0}, None]
    assert pg.typical_sentences(scores, ["local"], [[], [("other", True)]]) == [None, None]


def test_map_encoding_round_trip():
    m = np.array([[0.0, 1.0], [0.25, 0.75]])
    np.testing.assert_allclose(pg.decode_map(pg.encode_map(m), 2), m, atol=0.5 / 255)


def test_examples_are_the_stores_word_level_maps_and_the_typical_sentence(run):
    atlas = pd.read_csv(run["atlas"], sep="\t")
    ex = pg.examples_data([str(run["store"])], str(run["corpus"]), str(run["scores"]), atlas, SETTINGS)
    assert ex["note"] == ""
    # pool: sentences with 4..10 words, in order: records 0, 2, 3 (record 1 has 3 words)
    assert [s["record_id"] for s in ex["sentences"]] == ["r0", "r2", "r3"]
    assert ex["sentences"][0]["units"] == ["[CLS]", "the", "cat", "sat", "down", "here", "[SEP]"]
    # typical, layer-major: role local for 1-1 (scores over the pool 1, 3, 2 -> r2), syntactic for 1-2
    # (scores 3, 1, 0 -> r0), local (not held) for 1-3 (3, 1, 2 -> r0); 2-2 local (5, 1, 8 -> r3)
    by_head = [(t["role"], ex["sentences"][t["s"]]["record_id"], t["score"]) for t in ex["typical"]]
    assert by_head[:3] == [("local", "r2", 3.0), ("syntactic", "r0", 3.0), ("local", "r0", 3.0)]
    assert by_head[4] == ("local", "r3", 8.0)
    assert ex["typical"][2]["held"] is False
    with AttentionStore(run["store"]) as st:
        for i in range(L * H):
            layer, h = divmod(i, H)
            got = {e["s"] for e in ex["maps"][i]}
            assert got == {0, ex["typical"][i]["s"]}  # one example (the first pool sentence) + typical
            for e in ex["maps"][i]:
                k = {"r0": 0, "r2": 2, "r3": 3}[ex["sentences"][e["s"]]["record_id"]]
                t = st.tokens(k)
                want = word_level(st.maps(layer, k), t["word"], t["special"])[0][h]
                np.testing.assert_allclose(pg.decode_map(e["m"], len(want)), want, atol=0.5 / 255 + 1e-6)


def test_no_store_no_scores_or_no_maps_give_a_note_not_an_error(run):
    atlas = pd.read_csv(run["atlas"], sep="\t")
    ex = pg.examples_data(None, None, None, atlas, SETTINGS)
    assert ex["sentences"] == [] and "not extracted" in ex["note"]
    ex = pg.examples_data([str(run["store"])], str(run["corpus"]), None, atlas, SETTINGS)
    assert len(ex["sentences"]) == 1 and ex["typical"] == [None] * 6 and "no Pande sentence scores" in ex["note"]
    tok = [_tokenized(w, i) for i, w in enumerate(WORDS)]
    bare = run["tmp"] / "bare"
    with AttentionWriter(bare, tok, [f"r{i}" for i in range(4)], L, H, meta={"model": "m", "corpus": "c"}, maps=False):
        pass
    ex = pg.examples_data([str(bare)], str(run["corpus"]), str(run["scores"]), atlas, SETTINGS)
    assert ex["sentences"] == [] and ex["maps"] == [[]] * 6 and "keeps no maps" in ex["note"]


def test_scores_of_other_sequences_are_refused(run, tmp_path):
    bad = tmp_path / "bad.h5"
    shutil.copy(run["scores"], bad)
    with h5py.File(bad, "a") as f:
        del f["record_id"]
        f.create_dataset("record_id", data=np.array(["x", "r1", "r2", "r3"], dtype=object), dtype=h5py.string_dtype())
    with pytest.raises(ValueError, match="bad.h5: scores sequences differ"):
        pg.examples_data([str(run["store"])], str(run["corpus"]), str(bad), _atlas(), SETTINGS)


def test_page_is_self_contained_and_embeds_the_data(run, tmp_path):
    out = tmp_path / "index.html"
    html, sizes = pg.build_page(_sources(run), str(run["corpus"]), SETTINGS, out)
    assert out.read_text(encoding="utf-8") == html and sizes["m"] > 0
    assert "<script src" not in html and "<link" not in html and "@import" not in html
    assert "https://" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    data = pg.read_embedded(html)
    assert data["models"][0]["values"]["clark_behaviour"][1] == "next"
    assert data["default_column"] == "pande_syntactic_effect"
    # a value that closes a script tag stays inside the JSON
    hostile = "</script><!--<script><img src=x onerror=alert(1)>&amp;"
    d = pg.model_data("m", _atlas().assign(clark_behaviour=hostile), None)
    html = pg.render_page(pg.page_data([d], SETTINGS))
    assert html.count("</script>") == 2 and "<!--" not in html and "<img" not in html
    block = html[html.index('id="atlas-data">') : html.index("</script>")]
    assert not {"<", "&"} & set(block[len('id="atlas-data">') :])  # only \u003c, \u003e, \u0026 inside the block
    assert pg.read_embedded(html)["models"][0]["values"]["clark_behaviour"][0] == hostile


# --- the page in a browser ------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _artifacts() -> Path:
    d = Path(os.environ.get("HEADATLAS_ARTIFACTS", REPO / "results" / "ci-artifacts")) / "atlas_page"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _shown_equals(text: str, value) -> bool:
    """The card's text of a value is that value (numbers to 4 significant digits)."""
    if value is None:
        return text == "n/a"
    if isinstance(value, bool):
        return text == str(value)
    if isinstance(value, (int, float)):
        return math.isclose(float(text), value, rel_tol=5e-4, abs_tol=1e-12)
    return text == str(value)


def drive_page(html_path: Path, atlas_paths: dict[str, Path], shots: str) -> None:
    """Open the page in headless Chromium and check it against the atlas TSVs (the first model):
    no console errors, a click opens the card with every value of the TSV, Enter on a focused
    cell opens it too, the role and threshold filters highlight exactly the heads the TSV says."""
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium); CI installs it in .ci/run")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
    model, atlas_path = next(iter(atlas_paths.items()))
    atlas = pd.read_csv(atlas_path, sep="\t").sort_values(["layer", "head"]).reset_index(drop=True)
    out = _artifacts()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request",
            lambda r: errors.append(f"network request {r.url}") if not r.url.startswith(("file:", "data:")) else None,
        )
        page.goto(html_path.resolve().as_uri())
        panel = page.locator(f'.panel[data-model="{model}"]')
        cells = panel.locator(".cell")
        assert cells.count() == len(atlas)
        page.screenshot(path=str(out / f"{shots}_grid.png"), full_page=True)

        i = len(atlas) // 2 + 1
        cells.nth(i).click()
        card = page.locator("#card")
        assert card.is_visible()
        assert f"head {atlas['label'][i]} " in page.locator("#card-title").inner_text()
        # the card opens with the roles, the rank with the colour column's value, then the typical map; every
        # value is folded by family
        body = page.locator("#card-body > *")
        assert body.nth(0).inner_text().startswith("Roles held (FDR): ")
        families = card.locator("details.family")
        is_open = [families.nth(j).evaluate("d => d.open") for j in range(families.count())]
        chosen = page.locator("#colour-by").input_value()
        assert is_open and not any(is_open) and card.locator(f'details.family tr[data-col="{chosen}"]').count() == 1
        assert "; value " in card.locator("p.rank").inner_text()
        if card.locator("figure.example.typical").count():
            assert card.locator("figure.example.typical").is_visible()
            assert not card.locator("details.more-examples").evaluate("d => d.open")
        page.screenshot(path=str(out / f"{shots}_card_folded.png"))
        for j in range(families.count()):
            if not is_open[j]:
                families.nth(j).locator("summary").click()
        rows = card.locator("tr[data-col]")
        shown = {rows.nth(j).get_attribute("data-col"): rows.nth(j) for j in range(rows.count())}
        ci_of = {c: registry.ci_columns(c, atlas.columns) for c in atlas.columns}
        value_cols = [
            c
            for c in atlas.columns
            if c not in pg.ID_COLUMNS and not c.endswith(registry.CI_SUFFIXES) and not c.endswith(registry.KIND_SUFFIX)
        ]
        assert sorted(shown) == sorted(value_cols)
        for c in value_cols:
            cell = shown[c].locator("td.value")
            got = json.loads(cell.get_attribute("data-value"))
            want = atlas[c][i]
            if pd.isna(want):
                assert got is None, c
            elif isinstance(got, bool):
                assert got == (str(want) == "True"), c
            elif isinstance(want, (float, int, np.number)) and not isinstance(want, (bool, np.bool_)):
                assert got == float(want), c
            else:
                assert got == str(want), c
            assert _shown_equals(cell.inner_text(), got), (c, cell.inner_text(), got)
            if ci_of[c] and pd.notna(atlas[ci_of[c][0]][i]):
                lo, hi = shown[c].locator("td.ci").inner_text().strip("[]").split(", ")
                assert _shown_equals(lo, float(atlas[ci_of[c][0]][i])) and _shown_equals(
                    hi, float(atlas[ci_of[c][1]][i])
                )
        assert card.locator("p.rank").inner_text().startswith("Rank on ")
        page.screenshot(path=str(out / f"{shots}_card.png"))
        page.keyboard.press("Escape")
        assert not card.is_visible()

        cells.nth(0).focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("Enter")
        assert card.is_visible() and f"head {atlas['label'][1]} " in page.locator("#card-title").inner_text()
        page.keyboard.press("Escape")

        assert panel.locator(".grid.filtered").count() == 0
        role_col = next((c for c in atlas.columns if c.endswith("_sig_fdr")), None)
        if role_col is not None:
            page.select_option("#role-filter", role_col[: -len("_sig_fdr")])
            want = int(atlas[role_col].map(lambda v: str(v) == "True").sum())
            assert panel.locator(".cell.match").count() == want
            page.select_option("#role-mode", "faithful")
            faithful = role_col.replace("_sig_fdr", "_sig_faithful")
            assert panel.locator(".cell.match").count() == int(atlas[faithful].map(lambda v: str(v) == "True").sum())
            page.screenshot(path=str(out / f"{shots}_filter.png"), full_page=True)
            page.click("#reset")
        column = page.locator("#colour-by").input_value()
        vals = atlas[column].astype(float)
        t = float(vals.median())
        page.fill("#threshold", repr(t))
        assert panel.locator(".grid.filtered").count() == 1
        assert panel.locator(".cell.match").count() == int((vals >= t).sum()) < len(atlas) or vals.nunique() == 1
        page.click("#reset")
        assert panel.locator(".grid.filtered").count() == 0
        browser.close()
    assert errors == []


def test_page_in_chromium_hand_made_run(run):
    out = run["tmp"] / "index.html"
    second = run["tmp"] / "atlas2.tsv"
    _atlas().drop(columns=["det_kv_group"]).to_csv(second, sep="\t", index=False)
    sources = _sources(run)
    sources["m2"] = dict(sources["m"], atlas=str(second), stores=[], scores=None)
    pg.build_page(sources, str(run["corpus"]), SETTINGS, out)
    drive_page(out, {"m": run["atlas"]}, "hand_made")


def _chromium_page(html_path: Path, width: int, height: int, script: str, shot: str):
    """Open a page in headless Chromium at width x height, run ``script`` (a function body) and return what
    it returns, with a screenshot."""
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium); CI installs it in .ci/run")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": height})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html_path.resolve().as_uri())
        facts = page.evaluate("() => {" + script + "}")
        page.screenshot(path=str(_artifacts() / shot))
        browser.close()
    assert errors == []
    return facts


def test_two_models_fit_a_1280_px_window(run):
    """Both panels, their grids and agreement tables lie inside a 1,280 px window: no sideways scroll, nothing cut."""
    out = run["tmp"] / "index.html"
    sources = _sources(run, models=("m", "m2"))
    pg.build_page(sources, str(run["corpus"]), SETTINGS, out)
    facts = _chromium_page(out, 1280, 800, """
      const w = document.documentElement.clientWidth;
      const right = (sel) => [...document.querySelectorAll(sel)].map((e) => e.getBoundingClientRect().right);
      const cut = [...document.querySelectorAll('.panel')].flatMap((p) => [...p.querySelectorAll('.agreement, .grid')]
        .filter((e) => e.getBoundingClientRect().right > p.getBoundingClientRect().right + 0.5).map((e) => e.className));
      return {w: w, scroll: document.documentElement.scrollWidth, panels: right('.panel'), agreements: right('.agreement'),
              rows: document.querySelectorAll('.agreement tbody tr').length, cut: cut};
    """, "hand_made_1280.png")  # fmt: skip
    assert facts["scroll"] <= facts["w"] == 1280, facts
    assert len(facts["panels"]) == 2 and max(facts["panels"] + facts["agreements"]) <= 1280, facts
    assert facts["rows"] == 4 and facts["cut"] == [], facts


BIDI_WORDS = ("abc\u202edef", "tail", "\u2067x\u2069", "\u200fy", "end", "z")


def test_bidi_controls_in_corpus_text_and_ids_are_escaped_and_isolated(tmp_path):
    """U+202E (right-to-left override) and the other bidi controls in a corpus's words or record ids are shown
    escaped ([U+202E]) and isolated: they cannot reverse the rest of the card's text."""
    rng = np.random.default_rng(1)
    records = [Record(id=f"r\u202e{i}", words=BIDI_WORDS, segment=(0,) * len(BIDI_WORDS)) for i in range(2)]
    corpus = tmp_path / "corpus.jsonl.gz"
    write_records(records, corpus)
    tok = [_tokenized(r.words, i) for i, r in enumerate(records)]
    store = tmp_path / "store"
    with AttentionWriter(store, tok, [r.id for r in records], L, H, meta={"model": "m", "corpus": "c"}) as w:
        for k in range(len(tok)):
            for layer in range(L):
                w.write(k, layer, _maps(rng, len(tok[k])))
    atlas = tmp_path / "atlas.tsv"
    _atlas().assign(clark_behaviour="next\u202eprev").to_csv(atlas, sep="\t", index=False)
    out = tmp_path / "index.html"
    sources = {"m": {"atlas": str(atlas), "agreement": None, "stores": [str(store)], "scores": None}}
    pg.build_page(sources, str(corpus), dataclasses.replace(SETTINGS, examples=2), out)
    facts = _chromium_page(out, 1280, 800, """
      document.querySelector('.panel .cell').click();
      const card = document.getElementById('card');
      card.querySelectorAll('details').forEach((d) => { d.open = true; });
      const text = document.body.innerText + [...document.querySelectorAll('[aria-label]')].map((e) => e.getAttribute('aria-label')).join(' ');
      return {controls: [...text].filter((c) => /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/.test(c)).length,
              caption: card.querySelector('figcaption').textContent,
              labels: [...card.querySelectorAll('figure svg text')].map((t) => t.textContent),
              value: card.querySelector('tr[data-col="clark_behaviour"] td.value').textContent,
              isolated: getComputedStyle(card.querySelector('figcaption bdi')).unicodeBidi};
    """, "bidi_card.png")  # fmt: skip
    assert facts["controls"] == 0, facts
    assert facts["caption"] == "Example: record r[U+202E]0" and facts["isolated"] == "isolate", facts
    assert "abc[U+202E]def" in facts["labels"] and "[U+2067]x[U+2069]" in facts["labels"], facts["labels"]
    assert facts["value"] == "next[U+202E]prev"


def test_damaged_sample_maps_are_logged_and_counted_on_the_page(run, caplog):
    """A pool sentence whose stored maps are damaged is left out with a warning naming the store and the
    record, and the page shows how many were left out (not a silent 3 -> 2 examples)."""
    from headatlas.core.store import layer_file

    with AttentionStore(run["store"]) as st:
        a, b = int(st.stored_offsets[2]), int(st.stored_offsets[3])  # record r2 (in the pool)
    with h5py.File(layer_file(run["store"], 1), "r+") as f:
        f["attn"][:, a:b] = 0.9  # rows no longer sum to 1
    atlas = pd.read_csv(run["atlas"], sep="\t")
    settings = dataclasses.replace(SETTINGS, examples=3)
    with caplog.at_level("WARNING", logger="headatlas"):
        ex = pg.examples_data([str(run["store"])], str(run["corpus"]), str(run["scores"]), atlas, settings)
    assert [s["record_id"] for s in ex["sentences"]] == ["r0", "r3"] and ex["dropped"] == ["r2"]
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warning) == 1 and str(run["store"]) in warning[0] and "records r2 " in warning[0], warning
    assert "invalid attention map" in warning[0]
    out = run["tmp"] / "index.html"
    pg.build_page(_sources(run), str(run["corpus"]), settings, out)
    assert pg.read_embedded(out.read_text(encoding="utf-8"))["models"][0]["examples"]["dropped"] == ["r2"]
    facts = _chromium_page(out, 1280, 800, """
      const panel = document.querySelector('.panel .note.dropped');
      document.querySelector('.panel .cell').click();
      return {panel: panel && panel.textContent, card: (document.querySelector('#card .note.dropped') || {}).textContent};
    """, "dropped_card.png")  # fmt: skip
    assert facts["panel"].startswith("1 example sentence left out: stored maps damaged (record r2)"), facts
    assert facts["card"].startswith("1 example sentence left out"), facts


FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")


class Marionette:
    """The few commands of Firefox's Marionette protocol (length-prefixed JSON over TCP) the check below needs:
    no driver package, no browser download."""

    def __init__(self, port: int, timeout: float = 60.0):
        import socket
        import time

        deadline = time.time() + timeout
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        self.id = 0
        self._read()  # the server's greeting
        self.call("WebDriver:NewSession", {"capabilities": {}})

    def _read(self):
        head = b""
        while not head.endswith(b":"):
            head += self.sock.recv(1)
        n, body = int(head[:-1]), b""
        while len(body) < n:
            body += self.sock.recv(n - len(body))
        return json.loads(body)

    def call(self, name: str, params: dict):
        self.id += 1
        msg = json.dumps([0, self.id, name, params]).encode()
        self.sock.sendall(str(len(msg)).encode() + b":" + msg)
        _, _, error, result = self._read()
        assert error is None, (name, error)
        return result

    def js(self, script: str, *args):
        return self.call("WebDriver:ExecuteScript", {"script": script, "args": list(args)})["value"]

    def element(self, css: str, index: int = 0) -> str:
        found = self.call("WebDriver:FindElements", {"using": "css selector", "value": css})
        return next(iter(found[index].values()))

    def click(self, css: str, index: int = 0) -> None:
        self.call("WebDriver:ElementClick", {"id": self.element(css, index)})

    def keys(self, css: str, text: str, index: int = 0) -> None:
        """Real key presses into an element (WebDriver key codes: Enter \\ue007, Escape \\ue00c)."""
        self.call("WebDriver:ElementSendKeys", {"id": self.element(css, index), "text": text})


def test_page_in_firefox_hand_made_run(run, tmp_path):
    """The same page in headless Firefox: it renders every head, a click opens the card with the TSV's
    values, Enter on a focused cell opens it, the role filter highlights the heads the TSV says, and no
    script error was raised (window.onerror, installed before the page's own script runs)."""
    import socket
    import subprocess

    if FIREFOX is None:
        pytest.skip("no firefox on this machine (apt-get install -y firefox-esr)")
    out = tmp_path / "index.html"
    pg.build_page(_sources(run), str(run["corpus"]), SETTINGS, out)
    html = out.read_text(encoding="utf-8")
    # record script errors from the first line on
    out.write_text(
        html.replace(
            "<head>",
            "<head><script>window.__errors=[];window.onerror=function(m){window.__errors.push(String(m));};</script>",
            1,
        ),
        encoding="utf-8",
    )
    atlas = pd.read_csv(run["atlas"], sep="\t").sort_values(["layer", "head"]).reset_index(drop=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "user.js").write_text(f'user_pref("marionette.port", {port});\n')
    proc = subprocess.Popen([FIREFOX, "--headless", "--marionette", "--no-remote", "-profile", str(profile)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        m = Marionette(port)
        m.call("WebDriver:Navigate", {"url": out.resolve().as_uri()})
        assert m.js("return document.querySelectorAll('.panel[data-model=\"m\"] .cell').length") == len(atlas)
        i = len(atlas) // 2 + 1
        cells = '.panel[data-model="m"] .cell'
        m.click(cells, i)
        visible = "const c = document.getElementById('card'), r = c.getBoundingClientRect(); return !c.hidden && getComputedStyle(c).display !== 'none' && r.width > 0"
        assert m.js(visible)
        assert f"head {atlas['label'][i]} " in m.js("return document.getElementById('card-title').textContent")
        shown = m.js(
            "return [...document.querySelectorAll('#card tr[data-col]')].map(r => [r.dataset.col, r.querySelector('td.value').dataset.value])"
        )
        for col, value in shown:
            want, got = atlas[col][i], json.loads(value)
            if isinstance(got, float) and not isinstance(got, bool):
                assert got == float(want), col
        m.keys("#card", "\ue00c")  # Escape closes the card
        assert not m.js(visible)
        m.keys(cells, "\ue007", 0)  # Enter on the first cell opens its card
        assert m.js(visible) and f"head {atlas['label'][0]} " in m.js(
            "return document.getElementById('card-title').textContent"
        )
        role_col = next(c for c in atlas.columns if c.endswith("_sig_fdr"))
        m.js(
            "const s = document.getElementById('role-filter'); s.value = arguments[0]; s.dispatchEvent(new Event('change', {bubbles: true}))",
            role_col[: -len("_sig_fdr")],
        )
        want = int(atlas[role_col].map(lambda v: str(v) == "True").sum())
        assert m.js("return document.querySelectorAll('.panel[data-model=\"m\"] .cell.match').length") == want
        assert m.js("return window.__errors") == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- a maps: sample corpus, hostile corpus text, value kinds, the card's width -------------------------------

HOSTILE = ("<!--<script>", "</script>", '<img src=x onerror="window.__pwned=1">', "&amp;", "x")


def _grid_atlas(n_layers: int, n_heads: int) -> pd.DataFrame:
    """An atlas of every family on an L x H grid: ablation effects with kinds (exact, estimated (checked),
    unreliable, skipped: <reason>), detector columns with CIs, a long text value."""
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    n = len(layer)
    df = pd.DataFrame(
        {"model": "s", "layer": layer, "head": head, "label": [f"{a + 1}-{b + 1}" for a, b in zip(layer, head)]}
    )
    df["clark_behaviour"] = ["broad" if i % 2 else "next" for i in range(n)]
    df["clark_entropy"] = np.linspace(0.5, 3.0, n)
    df["pande_local_effect"] = np.linspace(0.25, 3.0, n)
    df["pande_local_sig_fdr"] = [i % 3 == 0 for i in range(n)]
    df["det_prev"] = np.linspace(0.0, 0.9, n)
    df["det_prev_ci_low"] = df["det_prev"] - 0.05
    df["det_prev_ci_high"] = df["det_prev"] + 0.05
    df["det_kv_group"] = head  # an encoder: one key/value head per query head
    kinds = ["exact", "estimated (checked)", "unreliable", "skipped: the model has no LM head for this task at all"]
    df["ablation_lm_loss_effect"] = np.linspace(-0.123456, 0.654321, n)
    df["ablation_lm_loss_ci_low"] = df["ablation_lm_loss_effect"] - 0.0123456
    df["ablation_lm_loss_ci_high"] = df["ablation_lm_loss_effect"] + 0.0234567
    df["ablation_lm_loss_effect_kind"] = [kinds[i % 4] for i in range(n)]
    df["ablation_lm_loss_method"] = ["skipped: " + "a reason long enough to overflow any table cell " * 3] * n
    return df


@pytest.fixture
def sample_run(tmp_path, tiny_loaded):
    """A real fused extraction of a corpus with hostile words (maps: sample, 3 of 5 records sampled) on the
    tiny BERT, its corpus file and an atlas of every family."""
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.extract import ExtractSettings, extract

    words = [
        ("the", "cat", "sat", "down", "here"),
        HOSTILE,
        ("we", "saw", "the", "big", "red", "bus"),
        ("a", "dog", "ran", "far", "away"),
        ("it", "was", "very", "cold", "today"),
    ]
    records = [Record(id=f"s{i}", words=w, segment=(0,) * len(w)) for i, w in enumerate(words)]
    corpus = tmp_path / "corpus.jsonl.gz"
    write_records(records, corpus)
    spec, model, tokenizer, config = tiny_loaded("bert")
    store = tmp_path / "shard0of1"
    extract(records, spec, model, tokenizer, config, store, ExtractSettings(overflow="truncate", maps=False, reps=False), meta={"corpus": "c", "shard": 0, "n_shards": 1}, reducers=[SurfaceReducer()], sample=[0, 1, 2], corpus_records=records)  # fmt: skip
    with AttentionStore(store) as st:
        n_layers, n_heads = st.n_layers, st.n_heads
    atlas = tmp_path / "atlas_s.tsv"
    _grid_atlas(n_layers, n_heads).to_csv(atlas, sep="\t", index=False, float_format="%.6g")
    return {"store": store, "corpus": corpus, "atlas": atlas, "tmp": tmp_path, "shape": (n_layers, n_heads)}


def test_sample_store_metadata_says_it_holds_maps(sample_run, capsys):
    from headatlas.cli import main
    from headatlas.core.store import describe_store

    parent, sample = describe_store([sample_run["store"]]), describe_store([sample_run["store"] / "sample"])
    assert (parent["maps"], parent["maps_mode"]) == (False, "sample")
    assert (sample["maps"], sample["maps_mode"], sample["sequences"]) == (True, "full", 3)
    assert main(["store", str(sample_run["store"] / "sample")]) == 0
    out = capsys.readouterr().out
    assert "maps            True" in out and "maps_mode       full" in out


def test_examples_of_a_sample_store_are_its_sampled_maps(sample_run):
    atlas = pd.read_csv(sample_run["atlas"], sep="\t")
    ex = pg.examples_data([str(sample_run["store"])], str(sample_run["corpus"]), None, atlas, SETTINGS)
    # pool: the sampled records with 4..10 words, in order (s3 and s4 were not sampled)
    assert [s["record_id"] for s in ex["sentences"]] == ["s0"]  # examples=1, no typical sentences
    with AttentionStore(sample_run["store"] / "sample") as st:
        t = st.tokens(0)
        want = word_level(st.maps(1, 0), t["word"], t["special"])[0][2]
    n_layers, n_heads = sample_run["shape"]
    got = ex["maps"][1 * n_heads + 2][0]
    np.testing.assert_allclose(pg.decode_map(got["m"], len(want)), want, atol=0.5 / 255 + 1e-6)
    settings = dataclasses.replace(SETTINGS, examples=3)
    ex = pg.examples_data([str(sample_run["store"])], str(sample_run["corpus"]), None, atlas, settings)
    assert [s["record_id"] for s in ex["sentences"]] == ["s0", "s1", "s2"]
    assert ex["sentences"][1]["units"][1:5] == list(HOSTILE[:4])


def test_value_kinds_kv_and_ci_pairs_in_the_data(sample_run):
    d = pg.model_data("s", pd.read_csv(sample_run["atlas"], sep="\t"), None)
    cols = {c["name"]: c for c in d["columns"]}
    eff = cols["ablation_lm_loss_effect"]
    assert eff["kinds"] == "ablation_lm_loss_effect_kind" and eff["ci"] == [
        "ablation_lm_loss_ci_low",
        "ablation_lm_loss_ci_high",
    ]
    assert cols["ablation_lm_loss_effect_kind"]["kinds_of"] == "ablation_lm_loss_effect"
    assert eff["unit"] == "nats per token" and cols["det_prev"]["ci"] == ["det_prev_ci_low", "det_prev_ci_high"]
    assert d["kv_shared"] is False  # one key/value group per head: no KV filter
    gqa = pd.read_csv(sample_run["atlas"], sep="\t").assign(det_kv_group=lambda a: a["head"] // 2)
    assert pg.model_data("s", gqa, None)["kv_shared"] is True
    assert [registry.kind_class(k) for k in ["exact", "estimated (checked)", "unreliable", "skipped: x", ""]] == [
        "exact", "estimated", "unreliable", "skipped", ""
    ]  # fmt: skip


def test_every_column_of_every_family_has_a_description_and_numbers_a_unit():
    """The registry covers what the atlas builds from each analysis's table (detectors and ablation included);
    Pearson-r probes are not called accuracies."""
    from headatlas.atlas import analysis as at

    layer, head = np.divmod(np.arange(4), 2)
    det = pd.concat(
        [pd.DataFrame({"layer": layer, "head": head, "detector": d, "main": True, "mean": 0.5, "ci_low": 0.4, "ci_high": 0.6,
                       "significant": True, "above_threshold": d == "sink", "kv_group": 0}) for d in ("prev", "duplicate", "induction", "sink")]
    )  # fmt: skip
    abl = pd.concat(
        [pd.DataFrame({"layer": layer, "head": head, "task": t, "metric": m, "effect": 0.1, "ci_low": 0.0, "ci_high": 0.2,
                       "method": "exact", "status": "ok", "reason": ""}) for t, m in (("lm", "loss"), ("sst2", "accuracy"), ("sst2", "loss"))]
    )  # fmt: skip
    probes = pd.concat(
        [pd.DataFrame({"layer": layer, "head": head, "task": t, "metric": m, "test_acc": 0.7, "selectivity": 0.1})
         for t, m in (("TreeDepth", "accuracy"), ("SICKR", "pearson"))]
    )  # fmt: skip
    wide = (
        at.detector_columns(det).merge(at.ablation_columns(abl), on=at.KEY).merge(at.probe_columns(probes), on=at.KEY)
    )
    assert "probe_SICKR_r" in wide and "probe_SICKR_acc" not in wide
    for c in wide.columns.drop(at.KEY):
        doc = registry.describe(c)
        assert doc.known, c
        if pd.api.types.is_numeric_dtype(wide[c]) and wide[c].dtype != bool and not c.endswith("_sig"):
            assert doc.unit, c
    assert (
        "accuracy" not in registry.describe("probe_SICKR_r").text()
        and "Pearson r" in registry.describe("probe_SICKR_r").unit
    )
    assert (
        registry.describe("det_prev").family == "detectors"
        and registry.describe("ablation_lm_loss_effect").family == "ablation"
    )


def _hostile_page(sample_run, run=None) -> Path:
    out = sample_run["tmp"] / "index.html"
    sources = {
        "s": {
            "atlas": str(sample_run["atlas"]),
            "agreement": None,
            "stores": [str(sample_run["store"])],
            "scores": None,
        }
    }
    pg.build_page(sources, str(sample_run["corpus"]), dataclasses.replace(SETTINGS, examples=3), out)
    html = out.read_text(encoding="utf-8")
    out.write_text(html.replace("<head>", "<head><script>window.__errors=[];window.onerror=function(m){window.__errors.push(String(m));};</script>", 1),
                   encoding="utf-8")  # fmt: skip
    return out


# runs in the page: the facts the browser tests check (both browsers)
PAGE_FACTS = """
const card = document.getElementById('card'), box = card.getBoundingClientRect();
card.querySelectorAll('details').forEach((d) => { d.open = true; });  // the folded families and examples
const inside = (e) => { const r = e.getBoundingClientRect(); return r.left >= box.left - 0.5 && r.right <= box.right + 0.5 && r.width > 0; };
const table = card.querySelector('table.values');
const cells = [...card.querySelectorAll('tr[data-col] td.value, tr[data-col] td.ci')];
const grid = [...document.querySelectorAll('.panel[data-model="s"] .cell')];
const bg = (e) => getComputedStyle(e);
return {
  pwned: window.__pwned === undefined ? null : window.__pwned, errors: window.__errors, imgs: document.querySelectorAll('img').length,
  cells: grid.length, figures: card.querySelectorAll('figure.example svg rect').length,
  labels: [...card.querySelectorAll('figure.example svg text')].map((t) => t.textContent),
  fits: table.scrollWidth <= table.clientWidth + 1 && table.getBoundingClientRect().right <= box.right + 0.5,
  outside: cells.filter((e) => !inside(e)).map((e) => e.parentElement.dataset.col + ': ' + e.textContent),
  cardWidth: box.width,
  kinds: grid.map((c) => [c.dataset.kind, c.className, bg(c).backgroundColor, bg(c).backgroundImage]),
  cardKind: [...card.querySelectorAll('tr[data-col="ablation_lm_loss_effect"] .kind')].map((e) => e.textContent),
  kv: document.getElementById('kv-filter').disabled,
};
"""


def _check_facts(f: dict, n_cells: int, kind_at_card: str) -> None:
    assert f["pwned"] is None and f["imgs"] == 0 and f["errors"] == [], f
    assert f["cells"] == n_cells
    assert f["figures"] > 0 and set(HOSTILE[:4]) <= set(f["labels"]), f["labels"][:20]  # maps drawn, text shown as text
    assert f["fits"] and f["outside"] == [], (f["cardWidth"], f["outside"])
    grey = "rgb(158, 158, 158)"
    for kind, cls, colour, image in f["kinds"]:
        if kind.startswith(("unreliable", "skipped")):
            assert colour == grey and "kind-" in cls, (kind, colour)
        elif kind.startswith("estimated"):
            assert "kind-estimated" in cls and "repeating-linear-gradient" in image, (kind, image)
            assert colour != grey
        else:
            assert colour != grey and "gradient" not in image, (kind, image)
    assert f["cardKind"] == [f"value: {kind_at_card}"]
    assert f["kv"] is True  # an encoder's heads share no key/value head


def test_page_in_chromium_sample_store_hostile_corpus_kinds_and_card_width(sample_run):
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium); CI installs it in .ci/run")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
    out = _hostile_page(sample_run)
    n_layers, n_heads = sample_run["shape"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(out.resolve().as_uri())
        page.select_option("#colour-by", "ablation_lm_loss_effect")
        page.locator('.panel[data-model="s"] .cell').nth(1).click()  # estimated (checked)
        facts = page.evaluate("() => {" + PAGE_FACTS + "}")
        page.screenshot(path=str(_artifacts() / "hostile_card.png"))
        browser.close()
    _check_facts(facts, n_layers * n_heads, "estimated (checked)")


def test_page_in_firefox_sample_store_hostile_corpus_kinds_and_card_width(sample_run, tmp_path):
    import socket
    import subprocess

    if FIREFOX is None:
        pytest.skip("no firefox on this machine (apt-get install -y firefox-esr)")
    out = _hostile_page(sample_run)
    n_layers, n_heads = sample_run["shape"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "user.js").write_text(f'user_pref("marionette.port", {port});\n')
    proc = subprocess.Popen([FIREFOX, "--headless", "--marionette", "--no-remote", "-profile", str(profile), "--width", "1400", "--height", "1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        m = Marionette(port)
        m.call("WebDriver:SetWindowRect", {"width": 1400, "height": 1000})
        m.call("WebDriver:Navigate", {"url": out.resolve().as_uri()})
        m.js(
            "const s = document.getElementById('colour-by'); s.value = 'ablation_lm_loss_effect'; s.dispatchEvent(new Event('change', {bubbles: true}))"
        )
        m.click('.panel[data-model="s"] .cell', 1)
        facts = m.js(PAGE_FACTS)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    _check_facts(facts, n_layers * n_heads, "estimated (checked)")
