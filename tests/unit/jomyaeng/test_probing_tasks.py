"""The SentEval-style task generator: labels on hand-made trees, sampling rules on real data."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO

from headatlas.jomyaeng.probing_tasks import (
    DownstreamSpec,
    GeneratorConfig,
    GeneratorError,
    Lexicon,
    Source,
    coordination_inversion,
    generate,
    generate_downstream,
    length_bin,
    load_sources,
    main_tense,
    object_number,
    quotas,
    shift_positions,
    somo_targets,
    subject_number,
    task_stats,
)
from headatlas.jomyaeng.ptb import TreeError, base_label, parse_trees, top_constituents, tree_depth

GUM_DEV = REPO / "resources" / "gum" / "ontogum_dev.conllu"
GUM_CONST_DEV = REPO / "resources" / "gum" / "const_dev.ptb.gz"
SICK = REPO / "resources" / "sick"


def src(rows: str, split: str = "train", id: str = "s") -> Source:
    """A Source from 'word/UPOS/XPOS/lemma/head(1-based)/deprel' tokens."""
    cols = [t.split("/") for t in rows.split()]
    return Source(
        id=id,
        split=split,
        words=tuple(c[0] for c in cols),
        upos=tuple(c[1] for c in cols),
        xpos=tuple(c[2] for c in cols),
        lemma=tuple(c[3] for c in cols),
        head=tuple(int(c[4]) - 1 for c in cols),
        deprel=tuple(c[5] for c in cols),
    )


CHASED = src(
    "The/DET/DT/the/2/det dogs/NOUN/NNS/dog/3/nsubj chased/VERB/VBD/chase/0/root a/DET/DT/a/5/det cat/NOUN/NN/cat/3/obj ./PUNCT/././3/punct"
)
HAS_EATEN = src(
    "The/DET/DT/the/2/det dog/NOUN/NN/dog/4/nsubj has/AUX/VBZ/have/4/aux eaten/VERB/VBN/eat/0/root bones/NOUN/NNS/bone/4/obj ./PUNCT/././4/punct"
)
WILL_EAT = src(
    "The/DET/DT/the/2/det dog/NOUN/NN/dog/4/nsubj will/AUX/MD/will/4/aux eat/VERB/VB/eat/0/root ./PUNCT/././4/punct"
)
COORD = src(
    "They/PRON/PRP/they/2/nsubj left/VERB/VBD/leave/0/root early/ADV/RB/early/2/advmod ,/PUNCT/,/,/7/punct "
    "but/CCONJ/CC/but/7/cc we/PRON/PRP/we/7/nsubj stayed/VERB/VBD/stay/2/conj ./PUNCT/././2/punct"
)
COORD_NO_SUBJ = src(
    "They/PRON/PRP/they/2/nsubj left/VERB/VBD/leave/0/root and/CCONJ/CC/and/4/cc slept/VERB/VBD/sleep/2/conj ./PUNCT/././2/punct"
)


def test_ptb_reader_depth_and_top_constituents():
    text = "(ROOT (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (PRP it)))) (. .)))\n\n( (NP (NN -LRB-a-RRB-)))"
    t1, t2 = parse_trees(text)
    assert t1.leaves() == ["The", "cat", "sat", "on", "it", "."]
    assert tree_depth(t1) == 5  # S > VP > PP > NP > PRP
    assert top_constituents(t1) == "NP_VP_."
    assert t2.leaves() == ["(a)"] and top_constituents(t2) == "NN" and tree_depth(t2) == 2
    assert base_label("NP-SBJ-1") == "NP" and base_label("-LRB-") == "-LRB-"
    with pytest.raises(TreeError, match="x.ptb:2"):
        parse_trees("(S (NP a)\n(VP b)))", where="x.ptb")
    with pytest.raises(TreeError, match="not closed"):
        parse_trees("(S (NP a)", where="x.ptb")


def test_tree_depth_counts_constituents_down_to_pos():
    (t,) = parse_trees("(ROOT (S (NP (DT a)) (VP (VBD b) (NP (NP (NN c)) (PP (IN d) (NP (NN e)))))))")
    # S > VP > NP > PP > NP > NN: 6 nodes on the longest path
    assert tree_depth(t) == 6


def test_length_bins_follow_senteval():
    edges = (5, 9, 13, 17, 21, 26, 29)
    assert [length_bin(n, edges) for n in (4, 5, 8, 9, 25, 26, 28, 29)] == [
        None,
        "5-8",
        "5-8",
        "9-12",
        "21-25",
        "26-28",
        "26-28",
        None,
    ]


def test_tense_and_number_labels_on_hand_made_trees():
    assert main_tense(CHASED) == "PAST"
    assert main_tense(HAS_EATEN) == "PRES"  # the finite auxiliary carries the tense
    assert main_tense(WILL_EAT) is None  # modal: no tense class
    assert subject_number(CHASED) == ("NNS", "dog")
    assert object_number(CHASED) == ("NN", "cat")
    assert subject_number(HAS_EATEN) == ("NN", "dog") and object_number(HAS_EATEN) == ("NNS", "bone")
    assert object_number(WILL_EAT) is None


def test_bigram_shift_positions_skip_punctuation():
    assert shift_positions(CHASED) == [0, 1, 2, 3]


def test_coordination_inversion():
    assert coordination_inversion(COORD) == ("We", "stayed", ",", "but", "they", "left", "early", ".")
    assert coordination_inversion(COORD_NO_SUBJ) is None  # the conjunct has no subject of its own
    assert coordination_inversion(CHASED) is None


def test_odd_man_out_replacement_is_same_tag_and_frequency():
    train = [
        src("A/DET/DT/a/2/det " + f"{w}/NOUN/NN/{w}/0/root", id=f"t{k}")
        for k, w in enumerate(["cat"] * 4 + ["dog"] * 5 + ["fox"] * 40)
    ]
    lex = Lexicon.build(train, seed=0, min_count=3)
    hits = []
    for split in ("train", "dev", "test"):
        s = src("A/DET/DT/a/2/det cat/NOUN/NN/cat/0/root", split=split)
        hits += [r for _, cands in somo_targets(s, lex, max_ratio=2.0) for r in cands]
    # 'dog' (5) is within a factor 2 of 'cat' (4); 'fox' (40) is not; never the word itself
    assert set(hits) <= {"dog"} and hits.count("dog") == 1


def test_quotas_are_as_balanced_as_the_data_allow():
    assert quotas({"a": 10, "b": 2, "c": 10}, 12) == {"a": 5, "b": 2, "c": 5}
    assert sorted(quotas({"a": 10, "b": 10}, 7).values()) == [3, 4]
    assert quotas({"a": 1, "b": 2}, 10) == {"a": 1, "b": 2}


def _slice(tmp: Path, name: str, conllu_blocks, tree_blocks, lo, hi):
    c, t = tmp / f"{name}.conllu", tmp / f"{name}.ptb"
    c.write_text("\n\n".join(conllu_blocks[lo:hi]) + "\n\n", encoding="utf-8")
    t.write_text("\n\n".join(tree_blocks[lo:hi]) + "\n", encoding="utf-8")
    return str(c), str(t)


@pytest.fixture(scope="module")
def gum_sources(tmp_path_factory):
    """GUM dev cut into three pseudo-splits (so that every split has trees)."""
    tmp = tmp_path_factory.mktemp("gum")
    blocks = [b for b in GUM_DEV.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    with gzip.open(GUM_CONST_DEV, "rt", encoding="utf-8") as fh:
        trees = [b for b in fh.read().split("\n\n") if b.strip()]
    assert len(blocks) == len(trees)
    tb, tr = {}, {}
    for split, lo, hi in (("train", 0, 900), ("dev", 900, 1250), ("test", 1250, len(blocks))):
        tb[split], tr[split] = _slice(tmp, split, blocks, trees, lo, hi)
    return load_sources({"gum": tb}, {"gum": tr})


SMALL = {
    "sizes": {"train": 60, "dev": 24, "test": 24},
    "wc_words": 8,
    "wc_band": [30, 600],
    "n_top": 3,
    "somo_min_count": 2,
}


@pytest.fixture(scope="module")
def generated(gum_sources):
    return generate(gum_sources, GeneratorConfig.from_config(SMALL))


def test_generator_is_deterministic(gum_sources, generated):
    records, table = generate(gum_sources, GeneratorConfig.from_config(SMALL))
    assert records == generated[0]
    assert table.equals(generated[1])


def test_generated_labels_and_sizes(gum_sources, generated):
    records, table = generated
    by_id = {r.id: r for r in records}
    src_by_id = {s.id: s for s in gum_sources}
    assert set(table["record"]) == set(by_id)
    assert set(table["task"]) == set(GeneratorConfig().tasks)
    for row in table.itertuples():
        words, s = by_id[row.record].words, src_by_id[row.source]
        assert row.split == s.split == by_id[row.record].split
        assert 5 <= len(words) <= 28
        if row.task == "SentLen":
            assert row.label == length_bin(len(words), GeneratorConfig().length_bins)
        elif row.task == "WordContent":
            assert [w.lower() for w in words].count(row.label) == 1
        elif row.task == "TreeDepth":
            assert int(row.label) == tree_depth(s.tree)
        elif row.task == "Tense":
            assert row.label == main_tense(s)
        elif row.task == "SubjNumber":
            assert (row.label, row.key) == subject_number(s)
        elif row.task == "BigramShift":
            diff = [i for i, (a, b) in enumerate(zip(words, s.words)) if a != b]
            assert (row.label == "O") == (not diff)
            if diff:
                assert len(diff) == 2 and diff[1] == diff[0] + 1 and sorted(words) == sorted(s.words)
        elif row.task == "OddManOut":
            diff = [i for i, (a, b) in enumerate(zip(words, s.words)) if a != b]
            assert len(diff) == (row.label == "C")
        elif row.task == "CoordinationInversion":
            assert (row.label == "I") == (words != s.words)
            assert Counter(w.lower() for w in words) == Counter(w.lower() for w in s.words)
    stats = task_stats(table)
    two_way = stats[stats["task"].isin(["BigramShift", "OddManOut", "SentLen", "TreeDepth", "Tense"])]
    assert (two_way["max_class"] - two_way["min_class"] <= 1).all(), two_way
    assert (
        stats.loc[stats["task"] == "SentLen", "n"] == stats.loc[stats["task"] == "SentLen", "split"].map(SMALL["sizes"])
    ).all()


def test_target_lemmas_disjoint_between_train_and_eval(generated):
    _, table = generated
    for task in ("Tense", "SubjNumber", "ObjNumber"):
        t = table[table["task"] == task]
        train = set(t.loc[t["split"] == "train", "key"])
        held = set(t.loc[t["split"] != "train", "key"])
        assert train and held and not train & held, task
    somo = table[(table["task"] == "OddManOut") & (table["label"] == "C")]
    per_split = [set(somo.loc[somo["split"] == s, "key"]) for s in ("train", "dev", "test")]
    assert not (per_split[0] & per_split[1]) and not (per_split[0] & per_split[2]) and not (per_split[1] & per_split[2])


def test_control_labels_are_a_function_of_the_first_word(generated):
    records, table = generated
    by_id = {r.id: r for r in records}
    first = table["record"].map(lambda r: by_id[r].words[0].lower())
    for task, g in table.assign(first=first).groupby("task"):
        assert (g.groupby("first")["control"].nunique() == 1).all(), task
        assert set(g["control"]) <= set(g["label"])
        train = g[g["split"] == "train"]
        if train["label"].nunique() == 2:  # the control keeps the task's class balance on train
            assert (
                abs(
                    train["control"].value_counts(normalize=True).max()
                    - train["label"].value_counts(normalize=True).max()
                )
                < 0.1
            ), task


def test_unknown_task_and_impossible_vocabulary_are_reported(gum_sources):
    with pytest.raises(GeneratorError, match="unknown tasks"):
        GeneratorConfig.from_config({"tasks": ["SentLen", "Parsing"]})
    cfg = GeneratorConfig.from_config(dict(SMALL, wc_words=500, tasks=["WordContent"]))
    with pytest.raises(GeneratorError, match="WordContent"):
        generate(gum_sources, cfg)


def test_downstream_pairs_share_sentences_and_items():
    def spec(name, kind, suffix):
        return DownstreamSpec.from_config(
            name,
            {"kind": kind, "text_columns": 2, "label_column": 2, "sizes": {"train": 30, "dev": 10, "test": 10},
             **{s: str(SICK / f"sick{s}{suffix}.tsv") for s in ("train", "dev", "test")}},
        )  # fmt: skip

    records, table = generate_downstream(
        [spec("SICKE", "classification", "-ent"), spec("SICKR", "relatedness", "")], seed=1
    )
    e, r = table[table["task"] == "SICKE"], table[table["task"] == "SICKR"]
    assert len(e) == len(r) == 50
    assert list(e["record_a"]) == list(r["record_a"]) and list(e["record_b"]) == list(r["record_b"])
    assert set(e["label"]) <= {"ENTAILMENT", "NEUTRAL", "CONTRADICTION"}
    assert r["label"].astype(float).between(1, 5).all()
    ids = {x.id for x in records}
    assert set(e["record_a"]) | set(e["record_b"]) <= ids
    with pytest.raises(GeneratorError, match="kind"):
        DownstreamSpec.from_config("X", {"kind": "regression"})
