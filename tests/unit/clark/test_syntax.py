"""Single-head dependency accuracy (Clark Table 1) on hand-built word-level maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.clark.syntax import (
    ALL,
    DEFAULT_OFFSETS,
    DIRECTIONS,
    RELATION_MAP,
    HeadSettings,
    WordMaps,
    best_table,
    collect_correctness,
    head_predictions,
    head_table,
    iter_word_maps,
    offset_predictions,
    relation_masks,
    sentence_ci,
    syntax_tables,
    table1,
    word_level,
)
from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record, TokenizedRecord
from headatlas.core.store import AttentionStore, AttentionWriter
from headatlas.core.store import word_level as store_word_level

# "The cat 's owner saw a dog ."  (0-based heads, -1 = ROOT)
WORDS = ("The", "cat", "'s", "owner", "saw", "a", "dog", ".")
HEADS = (1, 3, 1, 4, -1, 6, 4, 4)
DEPREL = ("det", "nmod:poss", "case", "nsubj", "root", "det", "obj", "punct")


def record(words=WORDS, heads=HEADS, deprel=DEPREL, rid="s1") -> Record:
    n = len(words)
    return Record(
        id=rid, words=tuple(words), segment=(0,) * n, head=tuple(heads), deprel=tuple(deprel), upos=("X",) * n
    )


def units(n_words: int):
    """[CLS] w0 .. w_{n-1} [SEP] as units."""
    unit_word = np.array([-1] + list(range(n_words)) + [-1])
    unit_special = np.array([SPECIAL_CLS] + [SPECIAL_NONE] * n_words + [SPECIAL_SEP])
    return unit_word, unit_special


def one_hot_maps(targets: list[list[int]], n_words: int) -> np.ndarray:
    """[K, U, U] maps: in map k, word i attends fully to unit targets[k][i]; specials to [SEP]."""
    u = n_words + 2
    maps = np.zeros((len(targets), u, u), dtype=np.float32)
    maps[:, :, u - 1] = 1.0
    for k, t in enumerate(targets):
        for i, j in enumerate(t):
            maps[k, i + 1] = 0.0
            maps[k, i + 1, j] = 1.0
    return maps


def offset_head(n: int, k: int) -> list[int]:
    """Unit targets of a head that attends to the word at offset k ([CLS]/[SEP] outside)."""
    return [i + k + 1 if 0 <= i + k < n else (0 if i + k < 0 else n + 1) for i in range(n)]


def gold_head(heads) -> list[int]:
    """Unit targets of a head that copies the gold tree (root word -> [CLS])."""
    return [h + 1 if h >= 0 else 0 for h in heads]


def test_head_predictions_exclude_self_and_nothing():
    maps = np.array([[[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.7, 0.3]]])
    pred = head_predictions(maps)
    # row 0: self excluded -> word 1; row 1: only self -> nothing; row 2: word 1
    assert pred[0, 0].tolist() == [1, -1, 1]
    # column view: who attends most to word 0 (nobody but itself), to 1 (row 2), to 2 (nobody)
    assert pred[1, 0].tolist() == [-1, 2, -1]


def test_offset_predictions_outside_sentence_predict_nothing():
    p = offset_predictions(3, [-1, 0, 2])
    assert p.tolist() == [[-2, 0, 1], [0, 1, 2], [2, -2, -2]]


@pytest.mark.parametrize("k", [-3, -2, -1, 1, 2])
def test_offset_head_matches_offset_baseline_exactly(k):
    n = len(WORDS)
    uw, us = units(n)
    wm = WordMaps(0, one_hot_maps([offset_head(n, k)], n), uw, us)
    c = collect_correctness([(wm, record(), n)], 1, 1, offsets=(-3, -2, -1, 0, 1, 2), poss_rule=False)
    col = c.offset_values.index(k)
    assert np.array_equal(c.heads[:, 0, 0], c.offsets[:, col])
    masks = relation_masks(c, 1)
    heads = head_table(c, masks, "m")
    base = pd.DataFrame([{"relation": r, "accuracy": c.offsets[m, col].mean()} for r, m in masks.items()])
    mine = heads[heads["direction"] == "dep->head"].set_index("relation")["accuracy"]
    assert np.allclose(mine.loc[base["relation"]].to_numpy(), base["accuracy"].to_numpy())


def test_gold_tree_head_is_perfect_except_root():
    n = len(WORDS)
    uw, us = units(n)
    wm = WordMaps(0, one_hot_maps([gold_head(HEADS), offset_head(n, 1)], n), uw, us)
    # the 's rule would give "cat" the prediction of "'s" (its own dependent) here
    c = collect_correctness([(wm, record(), n)], 1, 2, poss_rule=False)
    masks = relation_masks(c, 1)
    assert "root" not in masks
    best = best_table(c, masks, "m", n_boot=200, seed=1).set_index("relation")
    for rel in set(DEPREL) - {"root"}:
        assert best.loc[rel, "accuracy"] == 1.0
        assert (best.loc[rel, "layer"], best.loc[rel, "head"], best.loc[rel, "direction"]) == (0, 0, "dep->head")
    assert best.loc[ALL, "accuracy"] == pytest.approx((n - 1) / n)  # the root word is never right
    assert best.loc[ALL, "ci_low"] <= best.loc[ALL, "accuracy"] <= best.loc[ALL, "ci_high"]


def test_head_to_dependent_direction():
    # the head attends to its dependent: each head word's row points at one of its dependents
    words, heads, deprel = ("a", "b", "c"), (1, -1, 1), ("det", "root", "obj")
    uw, us = units(3)
    maps = one_hot_maps([[2 + 1, 0 + 1, 1 + 1]], 3)  # a->c, b->a, c->b
    c = collect_correctness([(WordMaps(0, maps, uw, us), record(words, heads, deprel), 3)], 1, 1)
    # head->dep: word 0 ("a") is attended most by "b" (its head): right; "c" is attended by "a": wrong
    assert c.heads[:, 1, 0].tolist() == [True, False, False]
    assert c.heads[:, 0, 0].tolist() == [False, False, True]


def test_poss_rule_uses_the_possessive_marker():
    n = len(WORDS)
    uw, us = units(n)
    t = gold_head(HEADS)
    t[1] = 0  # "cat" attends to [CLS]; "'s" attends to its head "cat" (gold)
    t[2] = 3 + 1  # now "'s" attends to "owner": the poss rule makes "cat" right
    wm = WordMaps(0, one_hot_maps([t], n), uw, us)
    on = collect_correctness([(wm, record(), n)], 1, 1, poss_rule=True)
    off = collect_correctness([(wm, record(), n)], 1, 1, poss_rule=False)
    i = list(DEPREL).index("nmod:poss")
    assert on.heads[i, 0, 0] and not off.heads[i, 0, 0]


def test_word_without_pieces_is_not_a_dependent_and_never_a_prediction():
    # word 2 ("'s") has no unit; "cat" -> "'s"? impossible; words whose head is it are wrong
    n = len(WORDS)
    uw = np.array([-1, 0, 1, 3, 4, 5, 6, 7, -1])
    us = np.array([SPECIAL_CLS] + [SPECIAL_NONE] * 7 + [SPECIAL_SEP])
    u = len(uw)
    maps = np.zeros((1, u, u), dtype=np.float32)
    unit_of = {w: i for i, w in enumerate(uw) if w >= 0}
    for w in unit_of:
        h = HEADS[w]
        maps[0, unit_of[w], unit_of.get(h, 0)] = 1.0
    c = collect_correctness([(WordMaps(0, maps, uw, us), record(), n)], 1, 1, poss_rule=False)
    assert c.n_missing == 1 and len(c.relation) == n - 1
    assert c.heads[:, 0, 0].sum() == n - 2  # all but root


def test_bootstrap_is_seeded_and_degenerate_when_all_right():
    correct = np.array([1, 0, 1, 1, 0, 1, 1, 1], dtype=bool)
    cluster = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    a = sentence_ci(correct, cluster, 500, seed=3)
    assert a == sentence_ci(correct, cluster, 500, seed=3)
    assert a[0] <= correct.mean() <= a[1]
    assert sentence_ci(np.ones(6, dtype=bool), np.arange(6), 100, 0) == (1.0, 1.0)


def test_table1_maps_relations_and_paper_numbers():
    n = len(WORDS)
    uw, us = units(n)
    wm = WordMaps(0, one_hot_maps([gold_head(HEADS)], n), uw, us)
    c = collect_correctness([(wm, record(), n)], 1, 1, poss_rule=False)
    masks = relation_masks(c, 2, also=["obj", "aux:pass"])
    assert list(masks) == ["All", "det", "obj"]  # det (2) passes the threshold; obj is asked for; aux:pass is absent
    t = table1(best_table(c, masks, "m", n_boot=10), min_count=2)
    assert list(t["paper_relation"][:2]) == ["All", "prep"]
    row = t[t["paper_relation"] == "dobj"].iloc[0]
    assert row["relation"] == "obj" and row["accuracy"] == 1.0 and row["paper_accuracy"] == 0.868
    assert row["below_min_count"] and not t[t["relation"] == "det"]["below_min_count"].iloc[0]
    assert t[t["relation"] == "aux:pass"]["n"].iloc[0] == 0  # absent here
    assert set(RELATION_MAP["relation"]) >= {"obj", "nmod:poss", "compound", "aux:pass", "compound:prt"}


def test_iter_word_maps_matches_word_level_per_layer(tmp_path):
    rng = np.random.default_rng(0)
    toks = []
    for i, n_words in enumerate((3, 4)):
        word = [-1, 0, 1, 1] + list(range(2, n_words)) + [-1]
        special = [SPECIAL_CLS] + [SPECIAL_NONE] * (len(word) - 2) + [SPECIAL_SEP]
        n = len(word)
        toks.append(TokenizedRecord(i, tuple(range(n)), tuple("p" * n), tuple(word), tuple(special), (0,) * n, n_words))
    L, H = 2, 3
    blocks = {}
    with AttentionWriter(tmp_path / "s", toks, ["a", "b"], L, H, meta={"model": "m"}) as w:
        for k, t in enumerate(toks):
            for layer in range(L):
                a = rng.random((H, len(t), len(t))).astype(np.float32)
                a /= a.sum(-1, keepdims=True)
                blocks[k, layer] = a
                w.write(k, layer, a)
    with AttentionStore(tmp_path / "s") as store:
        got = list(iter_word_maps(store, chunk=1))
        # a byte budget below one sequence's maps reads one sequence at a time: the same maps
        small = list(iter_word_maps(store, max_bytes=1))
    assert [g.k for g in got] == [0, 1] == [g.k for g in small]
    assert all(np.array_equal(a.maps, b.maps) for a, b in zip(got, small))
    for g, t in zip(got, toks):
        for layer in range(L):
            ref, uw, _ = store_word_level(blocks[g.k, layer], np.array(t.word), np.array(t.special))
            assert np.allclose(g.maps[layer * H : (layer + 1) * H], ref, atol=1e-6)
            assert np.array_equal(g.unit_word, uw)
    assert DIRECTIONS == ("dep->head", "head->dep")


@pytest.mark.parametrize("mode", ["mean", "first"])
def test_word_level_matches_the_store_aggregation(mode):
    rng = np.random.default_rng(2)
    word = np.array([-1, 0, 0, 1, 2, 2, 2, 3, -1])
    special = np.where(word < 0, SPECIAL_SEP, SPECIAL_NONE)
    special[0] = SPECIAL_CLS
    maps = rng.random((5, 9, 9)).astype(np.float32)
    maps /= maps.sum(-1, keepdims=True)
    ref = store_word_level(maps, word, special, mode)
    got = word_level(maps, word, special, mode)
    assert np.allclose(got[0], ref[0], atol=1e-6) and np.array_equal(got[1], ref[1]) and np.array_equal(got[2], ref[2])
    assert np.allclose(got[0].sum(-1), 1.0, atol=1e-5)


def first_documents(path, n: int) -> str:
    """The text of the first ``n`` documents (``# newdoc``) of a CoNLL-U file."""
    out, docs = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# newdoc"):
                docs += 1
                if docs > n:
                    break
            out.append(line)
    return "".join(out)


@pytest.mark.slow
def test_clark_syntax_dag_end_to_end(tmp_path, tiny_models, ewt_head_file):
    """A tiny BERT and its random-init copy through every rule of clark_syntax.smk."""
    import re

    from conftest import RESOURCES, output_of, run_snakemake

    gum = tmp_path / "gum_dev.conllu"
    gum.write_text(first_documents(RESOURCES / "gum" / "ontogum_dev.conllu", 3), encoding="utf-8")
    cfg = {
        "models": [
            {"name": "bert", "source": {"path": str(tiny_models["bert"])}, "max_length": 64, "batch_size": 8},
            {"name": "bert-random", "source": {"random_init": {"base": "bert", "seed": 1}}, "corpora": ["ewt_dev"]},
        ],
        "corpora": {
            "ewt_dev": {"kind": "conllu", "path": str(ewt_head_file), "reps": False},
            "gum_dev": {"kind": "conllu_documents", "path": str(gum), "overflow": "truncate", "reps": False},
        },
        "analysis": {
            "clark_syntax": {
                # one small corpus for everything, to keep the test short
                "coref_corpora": {"dev": "gum_dev"},
                "probe_train": "ewt_dev",
                "probe_eval": {"dev": "ewt_dev"},
                "random_baseline": {"bert": "bert-random"},
                "min_count": 5,
                "bootstrap": 20,
                "examples": {"relations": ["det", "nsubj"], "max_words": 40},
            }
        },
    }
    work = tmp_path / "work"
    work.mkdir()
    files = [
        "syntax/table1.png",
        "syntax/heads.png",
        "coref/table2.png",
        "coref/heads.png",
        "probes/table3.png",
        "examples/fig5.png",
    ]
    targets = [f"results/clark/bert/{f}" for f in files] + ["results/clark/relation_map.tsv"]
    # the default target: the random-init helper is extracted on its own corpora only and gets
    # no analysis target of its own; its probe is built only as an input of the base model's Table 3
    dry = run_snakemake(work, cfg, "-n", timeout=300)
    assert dry.returncode == 0, output_of(dry)[-4000:]
    assert "results/attention/bert-random/ewt_dev" in dry.stdout and "bert-random/gum_dev" not in dry.stdout
    assert (
        "results/clark/bert-random/probes/uas.tsv" in dry.stdout
        and "results/clark/bert-random/syntax" not in dry.stdout
    )
    paths = set(re.findall(r"results/[^\s,]*bert-random[^\s,]*", dry.stdout))
    allowed = (
        "results/attention/bert-random/",
        "results/models/random_init/bert-random",
        "results/clark/bert-random/probes/",
        "results/benchmarks/",  # every job's benchmark file
    )
    assert paths and not [p for p in paths if not p.startswith(allowed)]
    proc = run_snakemake(work, cfg, *targets, timeout=600)
    assert proc.returncode == 0, output_of(proc)[-6000:]
    out = work / "results" / "clark" / "bert"
    heads = pd.read_csv(out / "syntax" / "heads.tsv", sep="\t")
    assert list(heads.columns[:3]) == ["model", "layer", "head"] and len(heads[heads["relation"] == "All"]) == 2 * 2 * 4
    t1 = pd.read_csv(out / "syntax" / "table1.tsv", sep="\t")
    row = t1[t1["relation"] == "All"].iloc[0]
    assert row["ci_low"] <= row["accuracy"] <= row["ci_high"] and row["paper_accuracy"] == 0.345
    t2 = pd.read_csv(out / "coref" / "table2.tsv", sep="\t").set_index("system")
    assert t2.loc["Best head", "n"] > 0 and 0 <= t2.loc["Rule-based", "all"] <= 1
    t3 = pd.read_csv(out / "probes" / "table3.tsv", sep="\t").set_index("system")
    assert t3.loc["Random Init Attn + GloVe", "source_model"] == "bert-random"
    assert t3[["uas_dev"]].drop(index="Structural probe").notna().all().all()
    weights = pd.read_csv(out / "probes" / "attn_weights.tsv", sep="\t")
    assert len(weights) == 8
    for f in ("syntax/table1.png", "syntax/heads.svg", "coref/table2.png", "probes/table3.svg", "examples/fig5.png"):
        assert (out / f).stat().st_size > 0, f
    assert (work / "results" / "models" / "random_init" / "bert-random" / "random_init.json").is_file()
    assert not [p for p in (work / "results").rglob("*") if ".tmp" in p.name]


def test_syntax_tables_of_the_rule():
    n = len(WORDS)
    uw, us = units(n)
    wm = WordMaps(0, one_hot_maps([gold_head(HEADS)], n), uw, us)
    c = collect_correctness([(wm, record(), n)], 1, 1, poss_rule=False)
    t = syntax_tables(c, "m", HeadSettings(min_count=2, bootstrap=10, seed=0))
    assert list(t) == ["heads", "baselines", "relations", "table1"]
    assert set(t["relations"]["relation"]) == {
        "All",
        "det",
    }  # Table 1's rarer relations stay out of the per-head tables
    assert set(t["heads"]["relation"]) == {"All", "det"}
    assert t["table1"].equals(
        table1(best_table(c, relation_masks(c, 2, also=list(RELATION_MAP["relation"])), "m", n_boot=10), min_count=2)
    )


def test_head_settings_from_config():
    s = HeadSettings.pick({"word_mode": "first", "offsets": [-1, 1], "min_count": 5, "activate": True})
    assert s == HeadSettings(word_mode="first", offsets=(-1, 1), min_count=5)
    with pytest.raises(ValueError, match=r"analysis\.clark_syntax\.activate: unknown setting"):
        HeadSettings.from_config({"activate": True})
    assert HeadSettings.from_config({}) == HeadSettings() and HeadSettings().offsets == DEFAULT_OFFSETS
    with pytest.raises(TypeError):
        HeadSettings("first")  # keyword-only


def test_example_panels_of_the_rule(tmp_path):
    from headatlas.clark.syntax_figures import example_panels

    n = len(WORDS)
    uw, us = units(n)
    tok = TokenizedRecord(0, tuple(range(n + 2)), tuple("p" * (n + 2)), tuple(uw), tuple(us), (0,) * (n + 2), n)
    with AttentionWriter(tmp_path / "s", [tok], ["s1"], 1, 1, meta={"model": "m"}) as w:
        w.write(0, 0, one_hot_maps([gold_head(HEADS)], n))
    relations = pd.DataFrame([{"relation": "det", "layer": 0, "head": 0, "direction": "dep->head"}])
    table2 = pd.DataFrame(
        [
            {"system": "Best head", "scored_on": "all", "layer": 0, "head": 0},
            {"system": "Best head", "scored_on": "pronouns", "layer": 5, "head": 5},
        ]
    )
    with AttentionStore(tmp_path / "s") as store:
        both = (store, [record()])
        panels = example_panels(relations, table2, both, both, ["det", "amod"], max_words=18)
    assert len(panels) == 2  # amod is not among the best heads: no panel
    det, coref = panels
    assert det.title == "head 1-1: det (dependent -> head)"
    assert sorted(det.arcs) == [(1, 2), (6, 7)]  # The -> cat, a -> dog (units: [CLS] is 0)
    assert coref is None  # no coreference annotation in the record
    with AttentionStore(tmp_path / "s") as store:
        assert (
            example_panels(relations, table2, (store, [record()]), (store, [record()]), ["det"], max_words=4)[0] is None
        )
