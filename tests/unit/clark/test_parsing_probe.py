"""Attention-based probing classifiers (Clark Table 3) on hand-built maps with known trees."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.clark.glove import Glove
from headatlas.clark.parsing_probe import (
    PROBES,
    RANDOM_INIT,
    RIGHT_BRANCHING,
    attn_weights,
    build_probes,
    evaluate,
    fit_probes,
    history_table,
    probe_sentence,
    right_branching,
    table3,
    train,
    uas_table,
)
from headatlas.clark.syntax import WordMaps
from headatlas.core.data import SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record

torch = pytest.importorskip("torch")
torch.set_num_threads(1)


def tiny_glove(words) -> Glove:
    rng = np.random.default_rng(0)
    vocab = sorted({w.lower() for w in words})
    return Glove(rng.normal(size=(len(vocab), 6)).astype(np.float32), vocab)


def maps_for(record: Record, rng) -> WordMaps:
    """[CLS] words [SEP] units; map 0 copies the gold tree (dependent -> head, root -> [CLS]),
    map 1 attends to the next word, map 2 is noise."""
    n = len(record.words)
    u = n + 2
    maps = np.zeros((3, u, u), dtype=np.float32)
    maps[:, :, u - 1] = 1.0
    for i, h in enumerate(record.head):
        maps[0, i + 1] = 0.0
        maps[0, i + 1, h + 1 if h >= 0 else 0] = 1.0
        maps[1, i + 1] = 0.0
        maps[1, i + 1, i + 2] = 1.0
    noise = rng.random((u, u)).astype(np.float32)
    maps[2] = noise / noise.sum(-1, keepdims=True)
    unit_word = np.array([-1] + list(range(n)) + [-1])
    unit_special = np.array([SPECIAL_CLS] + [SPECIAL_NONE] * n + [SPECIAL_SEP])
    return WordMaps(0, maps, unit_word, unit_special)


@pytest.fixture(scope="module")
def sentences(ewt_records):
    rng = np.random.default_rng(0)
    glove = tiny_glove([w for r in ewt_records for w in r.words])
    return [probe_sentence(maps_for(r, rng), r, len(r.words), glove) for r in ewt_records]


def test_probe_sentence_targets_and_root_features(sentences, ewt_records):
    s, r = sentences[0], ewt_records[0]
    root = r.head.index(-1)
    assert s.target[root] == 0
    assert all(s.target[i] == h + 1 for i, h in enumerate(r.head) if h >= 0)
    assert s.root_start.shape == (6, len(r.words))
    assert s.root_start[0, root] == 1.0  # map 0: the root word attends to [CLS]
    assert s.score.sum() == sum(u != "PUNCT" for u in r.upos)


def test_gold_tree_head_scores_uas_100_at_argmax(sentences):
    probes = build_probes(n_maps=3, dim=6)
    with torch.no_grad():
        probes["Attn"].w.zero_()
        probes["Attn"].w[0] = 1.0
        probes["Attn"].root.copy_(torch.tensor([1.0, 0.0]))
    (c, n) = evaluate({"Attn": probes["Attn"]}, sentences)["Attn"]
    assert n > 0 and c == n


@pytest.mark.parametrize("name", ["Attn", "Attn + GloVe"])
def test_gold_tree_head_scores_uas_100_after_training(sentences, name):
    probes = {name: build_probes(n_maps=3, dim=6, seed=0)[name]}
    # a larger step than the paper's 0.002 so that 5 epochs over 40 sentences suffice
    history = train(probes, epochs=5, sentences=lambda e: sentences, lr=0.05)
    assert history[name][1] < history[name][0]
    c, n = evaluate(probes, sentences)[name]
    assert c == n
    if name == "Attn":
        w = attn_weights(probes[name], 1, 3, "m")
        assert w["weight_dep_to_head"].idxmax() == 0


def chain(n: int, rid: str) -> Record:
    """A right-branching tree: every word's head is the next word; the last is the root."""
    words = tuple(f"w{i % 5}" for i in range(n))
    return Record(
        id=rid,
        words=words,
        segment=(0,) * n,
        head=tuple(list(range(1, n)) + [-1]),
        upos=("X",) * n,
        deprel=("dep",) * n,
    )


def test_right_branching_and_distances_learn_a_chain():
    rng = np.random.default_rng(1)
    recs = [chain(int(n), f"c{i}") for i, n in enumerate(rng.integers(3, 12, size=30))]
    glove = tiny_glove([w for r in recs for w in r.words])
    sents = [probe_sentence(maps_for(r, rng), r, len(r.words), glove) for r in recs]
    assert right_branching(4).tolist() == [1, 2, 3, -1]
    probes = {"Distances + GloVe": build_probes(3, 6)["Distances + GloVe"]}
    train(probes, epochs=3, sentences=lambda e: sents, lr=0.01)
    res = evaluate(probes, sents)
    assert res[RIGHT_BRANCHING][0] == res[RIGHT_BRANCHING][1]
    assert res["Distances + GloVe"][0] == res["Distances + GloVe"][1]


def test_training_is_seeded(sentences):
    out = []
    for _ in range(2):
        probes = build_probes(3, 6, seed=4)
        train(probes, epochs=1, sentences=lambda e: sentences[:5])
        out.append([p.detach().numpy().copy() for p in probes["Attn + GloVe"].parameters()])
    assert all(np.array_equal(a, b) for a, b in zip(*out))
    assert set(PROBES) == {"Attn", "Attn + GloVe", "Distances + GloVe"}


def test_table3_joins_the_random_model():
    uas = pd.DataFrame(
        [(p, s, 0.5) for p in list(PROBES) + [RIGHT_BRANCHING] for s in ("dev", "test")],
        columns=["probe", "split", "uas"],
    )
    rnd = uas.assign(uas=0.3)
    t = table3(uas, rnd, "m", "m-random").set_index("system")
    assert t.loc[RANDOM_INIT, "uas_dev"] == 0.3 and t.loc[RANDOM_INIT, "source_model"] == "m-random"
    assert t.loc["Attn + GloVe", "paper_uas"] == 77.0 and t.loc["Attn", "uas_test"] == 0.5
    no_random = table3(uas, None, "m", None).set_index("system")
    assert np.isnan(no_random.loc[RANDOM_INIT, "uas_dev"])


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_random_init_model_keeps_only_the_embeddings(tmp_path, tiny_models, name):
    from transformers import AutoModel

    from headatlas.core.models import ModelSpec, random_init_model

    spec = ModelSpec.from_config({"name": name, "source": {"path": str(tiny_models[name])}})
    info = random_init_model(spec, None, seed=11, out_dir=tmp_path / "rand")  # not a seed the fixtures used
    base = AutoModel.from_pretrained(tiny_models[name]).state_dict()
    rand = AutoModel.from_pretrained(tmp_path / "rand").state_dict()
    assert info["kept"] and set(info["kept"]) <= set(base)
    assert any("position" in k or "wpe" in k for k in info["kept"]) == (name != "llama")  # llama: rotary, no table
    for k in base:
        same = torch.equal(base[k], rand[k])
        if k in info["kept"]:
            assert same, k
        elif k.endswith("weight") and base[k].dim() == 2:
            assert not same, k  # every other matrix is re-drawn
    again = random_init_model(spec, None, seed=11, out_dir=tmp_path / "rand2")
    assert again["kept"] == info["kept"]
    rand2 = AutoModel.from_pretrained(tmp_path / "rand2").state_dict()
    assert all(torch.equal(rand[k], rand2[k]) for k in rand)  # seeded
    assert (tmp_path / "rand" / "random_init.json").is_file() and (
        tmp_path / "rand" / "tokenizer_config.json"
    ).is_file()


def test_fit_and_uas_table_of_the_probe_rule(sentences):
    probes, history = fit_probes(lambda e: sentences, 3, 6, hidden=8, epochs=2, lr=0.05, seed=0)
    assert set(probes) == set(PROBES) and all(len(v) == 2 for v in history.values())
    uas = uas_table(probes, [("dev", 40, sentences), ("test", 5, sentences[:5])], "m")
    assert uas["split"].tolist() == ["dev"] * 4 + ["test"] * 4
    assert set(uas["probe"]) == set(PROBES) | {RIGHT_BRANCHING}
    assert uas["n_sentences"].tolist() == [40] * 4 + [5] * 4
    np.testing.assert_allclose(uas["uas"], uas["correct"] / uas["n_words"])
    h = history_table(history, "m", 40)
    assert len(h) == 3 * 2 and (h["n_train_sentences"] == 40).all() and h["epoch"].tolist()[:2] == [0, 1]
