"""Coreference head and baselines (Clark Table 2) on a hand-built document."""

from __future__ import annotations

import numpy as np
import pytest

from headatlas.clark.coref import (
    BASELINES,
    agree,
    baseline_table,
    collect,
    coref_tables,
    document_mentions,
    features,
    head_table,
    mention_head,
    table2,
)
from headatlas.clark.syntax import WordMaps
from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record

#         0      1     2      3    4     5      6      7       8      9     10
WORDS = ("John", "met", "Mary", ".", "He", "said", "she", "likes", "her", "dog", ".")
HEADS = (1, -1, 1, 1, 5, -1, 7, 5, 9, 7, 5)
UPOS = ("PROPN", "VERB", "PROPN", "PUNCT", "PRON", "VERB", "PRON", "VERB", "PRON", "NOUN", "PUNCT")
FEATS = (
    "Number=Sing",
    "_",
    "Number=Sing",
    "_",
    "Gender=Masc|Number=Sing|Person=3",
    "_",
    "Gender=Fem|Number=Sing|Person=3",
    "_",
    "Gender=Fem|Number=Sing|Person=3|Poss=Yes",
    "Number=Sing",
    "_",
)
MENTIONS = ((0, 0, 1), (2, 2, 2), (4, 4, 1), (6, 6, 2), (8, 8, 2), (8, 9, 3))
ANAPHOR_HEADS = [4, 6, 8]  # He, she, her
RIGHT = {4: [0], 6: [2], 8: [2, 6]}
NEAREST = {4: 2, 6: 4, 8: 6}


def doc(words=WORDS, heads=HEADS, upos=UPOS, feats=FEATS, mentions=MENTIONS, rid="d1") -> Record:
    n = len(words)
    return Record(
        id=rid,
        words=words,
        segment=(0,) * n,
        head=heads,
        upos=upos,
        feats=feats,
        deprel=("dep",) * n,
        mentions=mentions,
    )


def word_maps(targets: list[dict[int, int]], n: int) -> WordMaps:
    """[CLS] words [SEP]; map k: word i attends to word targets[k][i] (else to [SEP])."""
    u = n + 2
    maps = np.zeros((len(targets), u, u), dtype=np.float32)
    maps[:, :, u - 1] = 1.0
    for k, t in enumerate(targets):
        for i, j in t.items():
            maps[k, i + 1] = 0.0
            maps[k, i + 1, j + 1] = 1.0
    unit_word = np.array([-1] + list(range(n)) + [-1])
    unit_special = np.array([SPECIAL_CLS] + [SPECIAL_NONE] * n + [SPECIAL_SEP])
    return WordMaps(0, maps, unit_word, unit_special)


def test_mention_head_is_the_word_whose_head_is_outside():
    r = doc()
    assert mention_head(r, 8, 9) == 9  # "her dog" -> dog
    assert mention_head(r, 4, 4) == 4
    assert mention_head(r, 6, 9) == 7  # "she likes her dog" -> likes


def test_mentions_types_and_truncation():
    ms = document_mentions(doc(), n_words=9)
    assert [(m.first, m.last) for m in ms] == [(0, 0), (2, 2), (4, 4), (6, 6), (8, 8)]  # "her dog" crosses the cut
    assert [m.kind for m in ms] == ["proper", "proper", "pronoun", "pronoun", "pronoun"]


def test_agreement_from_feats_and_lexicon():
    r = doc()
    assert features(r, 4) == ("3", "Sing", "Masc")
    assert features(r, 0) == ("3", "Sing", None)  # nouns are third person; names have no gender
    assert not agree(features(r, 4), features(r, 6))
    assert agree(features(r, 0), features(r, 6))
    bare = doc(feats=("_",) * len(WORDS))
    assert features(bare, 6) == ("3", "Sing", "Fem")  # from the pronoun lexicon


def test_gold_head_is_perfect_and_nearest_head_matches_nearest_baseline():
    n = len(WORDS)
    gold = {a: RIGHT[a][-1] for a in ANAPHOR_HEADS}
    wm = word_maps([gold, NEAREST], n)
    res = collect([(wm, doc(), n, "dev")], 1, 2)
    assert res.anaphors.head == ANAPHOR_HEADS
    assert res.heads[:, 0].all()
    nearest = BASELINES.index("Nearest")
    assert np.array_equal(res.heads[:, 1], res.baselines[:, nearest])
    assert res.baselines[:, nearest].tolist() == [False, False, True]
    # head match has no same-head candidate here, so it falls back to the nearest
    assert res.baselines[:, BASELINES.index("Head match")].tolist() == [False, False, True]
    # rule-based: He -> Mary (agreeing, nearest; names carry no gender), she -> Mary (He disagrees), her -> she
    assert res.baselines[:, BASELINES.index("Rule-based")].tolist() == [False, True, True]
    t = table2(res, "m", n_boot=50)
    assert set(t["scored_on"]) == {"all"}  # one split: no held-out rows
    t = t.set_index("system")
    assert t.loc["Best head", "all"] == 1.0 and t.loc["Best head", "label"] == "1-1"
    assert t.loc["Nearest", "all"] == pytest.approx(1 / 3)
    assert t.loc["Best head", "paper_all"] == 0.65
    assert t.loc["Best head", "pronoun"] == 1.0 and np.isnan(t.loc["Best head", "proper"])


def test_sieve_order_exact_string_then_head_match():
    words = ("the", "big", "dog", "a", "dog", "it", "saw", "the", "big", "dog")
    heads = (2, 2, 6, 4, 6, 6, -1, 9, 9, 6)
    upos = ("DET", "ADJ", "NOUN", "DET", "NOUN", "PRON", "VERB", "DET", "ADJ", "NOUN")
    mentions = ((0, 2, 1), (3, 4, 2), (5, 5, 2), (7, 9, 1))
    r = doc(words, heads, upos, ("_",) * 10, mentions, "d2")
    res = collect([(word_maps([{}], 10), r, 10, "test")], 1, 1)
    # anaphors: "it" (-> "a dog"), "the big dog" (-> "the big dog", exact string, not the nearer "a dog")
    assert res.anaphors.head == [5, 9]
    rule = BASELINES.index("Rule-based")
    assert res.baselines[:, rule].tolist() == [True, True]
    # head match picks the nearest "dog" (head 4, "a dog"): wrong for the second anaphor
    assert res.baselines[:, BASELINES.index("Head match")].tolist() == [True, False]
    # a head with no attention on any candidate predicts nothing
    assert res.heads[:, 0].tolist() == [False, False]


def test_tables_have_every_split_and_type():
    n = len(WORDS)
    res = collect([(word_maps([{}], n), doc(), n, "dev"), (word_maps([{}], n), doc(rid="d3"), n, "test")], 1, 1)
    h = head_table(res, "m")
    assert set(h["split"]) == {"all", "dev", "test"} and set(h["type"]) == {"all", "pronoun", "proper", "nominal"}
    assert h[(h["split"] == "all") & (h["type"] == "all")]["n"].iloc[0] == 6
    b = baseline_table(res, "m")
    assert len(b) == 3 * 4 * len(BASELINES)


def test_no_anaphor_is_an_error():
    n = len(WORDS)
    with pytest.raises(ValueError, match="no mention"):
        collect([(word_maps([{}], n), doc(mentions=((0, 0, 1),)), n, "dev")], 1, 1)


def test_table2_held_out_rows_choose_on_the_first_split():
    n = len(WORDS)
    gold = {a: RIGHT[a][-1] for a in ANAPHOR_HEADS}
    # head 0 is right on the dev document only, head 1 on the test document only
    items = [
        (word_maps([gold, NEAREST], n), doc(), n, "dev"),
        (word_maps([NEAREST, gold], n), doc(rid="d9"), n, "test"),
    ]
    t = table2(collect(items, 1, 2), "m", n_boot=20)
    held = t[(t["scored_on"] == "test") & (t["system"] == "Best head")].iloc[0]
    assert held["selected_on"] == "dev" and held["label"] == "1-1" and held["n"] == 3
    assert held["all"] == pytest.approx(1 / 3)  # head 0 on the test document: the nearest candidate
    assert len(t[t["scored_on"] == "test"]) == 4 and t[t["scored_on"] == "test"]["paper_all"].isna().all()


def test_coref_tables_best_head_column_follows_table2():
    n = len(WORDS)
    gold = {a: RIGHT[a][-1] for a in ANAPHOR_HEADS}
    # head 1 (label 1-2) is always right, head 0 points at the nearest candidate
    res = collect([(word_maps([NEAREST, gold], n), doc(), n, "dev")], 1, 2)
    out = coref_tables(res, "m", n_boot=10, seed=0)
    assert list(out) == ["heads", "baselines", "anaphors", "table2"]
    an = out["anaphors"]
    assert an["head"].tolist() == ANAPHOR_HEADS and an["best_head"].all()
    assert an["n_candidates"].tolist() == [2, 3, 4]  # the mentions before each anaphor
    assert list(an.columns[-len(BASELINES) - 1 : -1]) == list(BASELINES)
    best = out["table2"].query("system == 'Best head' and scored_on == 'all'").iloc[0]
    assert best["label"] == "1-2" and best["all"] == 1.0


def test_coref_settings_from_config():
    from headatlas.clark.coref import CorefSettings

    s = CorefSettings.pick({"word_mode": "first", "bootstrap": 10, "seed": 3, "min_count": 100})
    assert s == CorefSettings(word_mode="first", bootstrap=10, seed=3)
    assert CorefSettings.from_config({}) == CorefSettings()
    with pytest.raises(TypeError):
        CorefSettings("first")  # keyword-only
