"""Sieve bias scores (Pande et al. 2021) on hand-built maps, against a loop-by-loop reference."""

from __future__ import annotations

import numpy as np
import pytest
from reference.sieves import score_store, sequence_scores

from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP, Record
from headatlas.pande.roles import TOKEN_ROLES, Band, Block, Keys, role_names, token_roles
from headatlas.pande.sieves import SieveSettings, dependency_pairs, query_segment

ROLES = role_names(("nsubj", "obj", "amod", "advmod"))
R = {name: i for i, name in enumerate(ROLES)}


def encoder_pair():
    """[CLS] w0 w1 w1 w2 [SEP] w3 w4 w4 [SEP]: word 1 and word 4 are split into two pieces."""
    special = np.array([SPECIAL_CLS, 0, 0, 0, 0, SPECIAL_SEP, 0, 0, 0, SPECIAL_SEP])
    segment = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    word = np.array([-1, 0, 1, 1, 2, -1, 3, 4, 4, -1])
    # w0 <-nsubj- w1 (root) -obj-> w2 ; w3 <-amod- w4 (root)
    head = [1, -1, 1, 4, -1]
    deprel = ["nsubj", "root", "obj", "amod", "root"]
    return special, segment, word, head, deprel


def decoder_single():
    """BOS w0 w1 w1 w2 (one segment)."""
    special = np.array([SPECIAL_BOS, 0, 0, 0, 0])
    segment = np.zeros(5, dtype=np.int64)
    word = np.array([-1, 0, 1, 1, 2])
    head = [1, -1, 1]  # w0 -> w1 (head to the right: invisible under the causal mask), w2 -> w1
    deprel = ["nsubj", "root", "dobj"]
    return special, segment, word, head, deprel


def uniform(n, causal=False, heads=2):
    a = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    return np.broadcast_to(a / a.sum(-1, keepdims=True), (heads, n, n)).astype(np.float32)


def random_maps(n, causal, heads=3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.gamma(0.3, size=(heads, n, n))
    if causal:
        a = a * np.tril(np.ones((n, n)))
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


# --- a plain reference: one query, one head, one role at a time --------------------------------


def reference(a, special, segment, word, head, deprel, settings, causal):
    """Scores of one [n, n] map following shared methods §1.2-1.3 literally (with the causal cut)."""
    n = len(a)
    vis = lambda i: [j for j in range(n) if (j <= i or not causal)]  # noqa: E731
    out = np.full(len(ROLES), np.nan)
    content = [j for j in range(n) if special[j] == SPECIAL_NONE]
    pair = any(segment[j] == 1 for j in content)

    def qseg(i):
        if special[i] == SPECIAL_NONE:
            return segment[i]
        after = [j for j in content if j >= i]
        return segment[after[0]] if after else segment[content[-1]]

    def bias(i, sieve, entropy=False):
        keys = [j for j in sieve if j in vis(i)]
        if not keys:
            return None
        b = np.mean([a[i, j] for j in keys]) / (sum(a[i, j] for j in vis(i)) / len(vis(i)))
        if entropy:
            p = np.array([a[i, j] for j in vis(i)], dtype=np.float64)
            p = p / p.sum()
            b *= -sum(x * np.log(x) for x in p if x > 0)
        return b

    def sieve_of(kind):
        """The keys of query i under a sieve kind of the registry (pande/roles.py), spelled out."""
        if isinstance(kind, Band):
            w = settings.window
            offs = range(-w, w + 1) if kind.offsets is None else kind.offsets
            return lambda i: [i + o for o in offs if 0 <= i + o < n]
        if isinstance(kind, Keys):
            kinds = {k for g in kind.groups for k in g}
            return lambda i: [j for j in range(n) if special[j] in kinds]
        return lambda i: [j for j in content if segment[j] == qseg(i)]  # Block

    for role, r in token_roles().items():
        block = isinstance(r.sieve, Block)
        if block and not pair:
            continue
        sieve = sieve_of(r.sieve)
        vals = [bias(i, sieve(i), entropy=block and settings.block_entropy) for i in range(n)]
        vals = [v for v in vals if v is not None]
        if vals:
            out[R[role]] = np.mean(vals)
    labels = settings.label_map()
    pairs = {r: [] for r in range(len(settings.relations))}
    toks = lambda w: [j for j in range(n) if word[j] == w and special[j] == SPECIAL_NONE]  # noqa: E731
    for d, (h, rel) in enumerate(zip(head, deprel)):
        if rel not in labels or h < 0:
            continue

        def pair_score(q, k):
            vals = [bias(i, toks(k)) for i in toks(q)]
            vals = [v for v in vals if v is not None]
            return np.mean(vals) if vals else None

        if settings.direction == "dep_to_head":
            s = pair_score(d, h)
        elif settings.direction == "head_to_dep":
            s = pair_score(h, d)
        else:
            both = [x for x in (pair_score(d, h), pair_score(h, d)) if x is not None]
            s = np.mean(both) if both else None
        if s is not None:
            pairs[labels[rel]].append(s)
    for r, rel in enumerate(settings.relations):
        if pairs[r]:
            out[R[f"syntactic_{rel}"]] = np.mean(pairs[r])
    union = [s for v in pairs.values() for s in v]
    if union:
        out[R["syntactic"]] = np.mean(union)
    return out


# --- tests ---------------------------------------------------------------------------------------


def test_uniform_attention_scores_one_and_block_ln_n():
    special, segment, word, head, deprel = encoder_pair()
    st = SieveSettings()
    n = len(special)
    scores, counts = sequence_scores(uniform(n), special, segment, word, dependency_pairs(head, deprel, st), st)
    assert scores.shape == (2, len(ROLES))
    for role in ROLES:
        if role == "syntactic_advmod":
            assert np.isnan(scores[:, R[role]]).all()  # no advmod pair in this sentence
        elif role == "block":
            np.testing.assert_allclose(scores[:, R[role]], np.log(n), rtol=1e-6)
        else:
            np.testing.assert_allclose(scores[:, R[role]], 1.0, rtol=1e-6, err_msg=role)
    assert counts.tolist() == [1, 1, 1, 0, 3]  # nsubj, obj, amod, advmod, union
    flat = SieveSettings(block_entropy=False)
    s2, _ = sequence_scores(uniform(n), special, segment, word, dependency_pairs(head, deprel, flat), flat)
    np.testing.assert_allclose(s2[:, R["block"]], 1.0, rtol=1e-6)


def test_uniform_causal_attention_scores_one():
    special, segment, word, head, deprel = decoder_single()
    st = SieveSettings()
    scores, counts = sequence_scores(
        uniform(5, causal=True), special, segment, word, dependency_pairs(head, deprel, st), st, causal=True
    )
    for role in ("local", "delimiter", "delimiter_cls", "syntactic", "syntactic_obj"):
        np.testing.assert_allclose(scores[:, R[role]], 1.0, rtol=1e-6, err_msg=role)
    # no [SEP] in a decoder input, no pair, and the nsubj head lies to the right of its dependent
    for role in ("delimiter_sep", "block", "syntactic_nsubj"):
        assert np.isnan(scores[:, R[role]]).all(), role
    assert counts.tolist() == [0, 1, 0, 0, 1]


@pytest.mark.parametrize("n", [6, 9, 20])
def test_previous_token_head_local_bias_is_n_over_band_size(n):
    a = np.zeros((1, n, n), dtype=np.float32)
    a[0, np.arange(1, n), np.arange(n - 1)] = 1.0
    a[0, 0, 0] = 1.0
    special = np.array([SPECIAL_CLS] + [0] * (n - 2) + [SPECIAL_SEP])
    word = np.array([-1] + list(range(n - 2)) + [-1])
    st = SieveSettings()
    scores, _ = sequence_scores(a, special, np.zeros(n, dtype=np.int64), word, dependency_pairs([], [], st), st)
    band = np.array([min(i + 2, n - 1) - max(0, i - 2) + 1 for i in range(n)])  # the true |S_i|
    np.testing.assert_allclose(scores[0, R["local"]], np.mean(n / band), rtol=1e-6)


@pytest.mark.parametrize("direction", ["dep_to_head", "head_to_dep", "both"])
@pytest.mark.parametrize("block_entropy", [True, False])
def test_matches_loop_reference_encoder(direction, block_entropy):
    special, segment, word, head, deprel = encoder_pair()
    st = SieveSettings(direction=direction, block_entropy=block_entropy, labels={"obj": ("obj", "dobj")})
    a = random_maps(len(special), causal=False, heads=3, seed=1)
    scores, _ = sequence_scores(a, special, segment, word, dependency_pairs(head, deprel, st), st)
    for h in range(3):
        ref = reference(a[h], special, segment, word, head, deprel, st, causal=False)
        np.testing.assert_allclose(scores[h], ref, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("direction", ["dep_to_head", "head_to_dep", "both"])
def test_matches_loop_reference_decoder_pair(direction):
    # BOS a0 a1 a1 b2 b3 b3 (a pair without separators, as a decoder reads it)
    special = np.array([SPECIAL_BOS, 0, 0, 0, 0, 0, 0])
    segment = np.array([0, 0, 0, 0, 1, 1, 1])
    word = np.array([-1, 0, 1, 1, 2, 3, 3])
    head, deprel = [1, -1, 3, -1], ["nsubj", "root", "amod", "root"]
    st = SieveSettings(direction=direction, window=1)
    a = random_maps(7, causal=True, heads=2, seed=3)
    scores, _ = sequence_scores(a, special, segment, word, dependency_pairs(head, deprel, st), st, causal=True)
    for h in range(2):
        ref = reference(a[h], special, segment, word, head, deprel, st, causal=True)
        np.testing.assert_allclose(scores[h], ref, rtol=1e-5, equal_nan=True)


def test_single_sentence_has_no_block_score():
    special = np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP])
    st = SieveSettings()
    s, _ = sequence_scores(
        uniform(4), special, np.zeros(4, dtype=np.int64), np.array([-1, 0, 1, -1]), dependency_pairs([], [], st), st
    )
    assert np.isnan(s[:, R["block"]]).all()
    assert not np.isnan(s[:, R["local"]]).any()


def test_dependency_pairs_labels_and_truncation():
    st = SieveSettings()
    dep, head, rel = dependency_pairs([1, -1, 1, 1], ["nsubj", "root", "dobj", "obj"], st)
    assert dep.tolist() == [0, 2, 3] and head.tolist() == [1, 1, 1] and rel.tolist() == [0, 1, 1]
    dep, head, rel = dependency_pairs([1, -1, 1, 1], ["nsubj", "root", "dobj", "obj"], st, n_words=3)
    assert dep.tolist() == [0, 2]
    only_ud = SieveSettings(labels={})
    assert dependency_pairs([1, -1, 1], ["nsubj", "root", "dobj"], only_ud)[0].tolist() == [0]
    with pytest.raises(ValueError, match="two relations"):
        SieveSettings(relations=("obj", "dobj"), labels={"obj": ("obj", "dobj")}).label_map()
    with pytest.raises(ValueError, match="direction"):
        SieveSettings(direction="sideways")


def test_query_segment_follows_the_reference_code():
    # [CLS] A A [SEP] B B [SEP]: [CLS] -> A, first [SEP] -> B, last [SEP] -> B
    special = np.array([SPECIAL_CLS, 0, 0, SPECIAL_SEP, 0, 0, SPECIAL_SEP])
    segment = np.array([0, 0, 0, 0, 1, 1, 1])
    assert query_segment(special, segment).tolist() == [0, 0, 0, 1, 1, 1, 1]


def _write_store(path, seqs, n_layers=2, n_heads=3, kind="encoder"):
    from headatlas.core.data import TokenizedRecord
    from headatlas.core.store import AttentionWriter

    tok = [
        TokenizedRecord(
            record_index=k,
            ids=tuple(range(len(s[0]))),
            pieces=tuple("p" * len(s[0])),
            word=tuple(s[2]),
            special=tuple(s[0]),
            segment=tuple(s[1]),
            n_words=int(max(s[2])) + 1,
        )  # fmt: skip
        for k, s in enumerate(seqs)
    ]
    maps = {}
    with AttentionWriter(
        path,
        tok,
        [f"r{k}" for k in range(len(seqs))],
        n_layers,
        n_heads,
        meta={"model": "toy", "model_kind": kind, "corpus": "toy"},
    ) as w:
        for k, s in enumerate(seqs):
            for layer in range(n_layers):
                maps[k, layer] = random_maps(len(s[0]), kind == "decoder", n_heads, seed=10 * k + layer)
                w.write(k, layer, maps[k, layer])
    return maps


def test_score_store_matches_sequence_scores_across_chunks(tmp_path):
    from headatlas.core.store import AttentionStore

    special, segment, word, head, deprel = encoder_pair()
    single = (np.array([SPECIAL_CLS, 0, 0, 0, SPECIAL_SEP]), np.zeros(5, dtype=np.int64), np.array([-1, 0, 1, 2, -1]))
    seqs = [(special, segment, word), single, (special, segment, word)]
    records = [
        Record(id="r0", words=tuple("abcde"), segment=(0, 0, 0, 1, 1), head=tuple(head), deprel=tuple(deprel)),
        Record(id="r1", words=tuple("abc"), segment=(0, 0, 0), head=(1, -1, 1), deprel=("nsubj", "root", "advmod")),
        Record(id="r2", words=tuple("abcde"), segment=(0, 0, 0, 1, 1), head=tuple(head), deprel=tuple(deprel)),
    ]
    maps = _write_store(tmp_path / "s", seqs)
    st = SieveSettings()
    with AttentionStore(tmp_path / "s") as store:
        out = score_store(store, records, st, max_bytes=1)  # one sequence per chunk
        out_big = score_store(store, records, st)
    assert out["scores"].shape == (3, 2, 3, len(ROLES))
    np.testing.assert_array_equal(out["scores"], out_big["scores"])
    for k, (sp, sg, wd) in enumerate(seqs):
        r = records[k]
        for layer in range(2):
            exp, _ = sequence_scores(maps[k, layer], sp, sg, wd, dependency_pairs(r.head, r.deprel, st), st)
            np.testing.assert_allclose(out["scores"][k, layer], exp, rtol=1e-6, equal_nan=True)
    assert out["is_pair"].tolist() == [True, False, True]
    assert out["pair_counts"][:, -1].tolist() == [3, 2, 3]
    assert out["pairs_present"].tolist() == [3, 2, 2, 1, 8] == out["pair_counts"].sum(0).tolist()
    assert out["notes"] == {}


def test_score_store_notes_roles_without_sentences(tmp_path):
    from headatlas.core.store import AttentionStore

    single = (np.array([SPECIAL_CLS, 0, 0, 0, SPECIAL_SEP]), np.zeros(5, dtype=np.int64), np.array([-1, 0, 1, 2, -1]))
    records = [
        Record(id="r0", words=tuple("abc"), segment=(0, 0, 0), head=(1, -1, 1), deprel=("nsubj", "root", "amod"))
    ]
    _write_store(tmp_path / "s", [single])
    st = SieveSettings(relations=("nsubj", "amod", "iobj"))
    with AttentionStore(tmp_path / "s") as store:
        out = score_store(store, records, st)
    assert set(out["notes"]) == {"block", "syntactic_iobj"}
    assert "no sentence pairs" in out["notes"]["block"]
    assert "relation iobj" in out["notes"]["syntactic_iobj"]
    assert np.isnan(out["scores"][..., out["roles"].index("syntactic_iobj")]).all()


def test_parse_records_aligns_words_and_segments():
    from headatlas.core.parse import load_parser, parse_records, trees_of

    nlp = load_parser()
    recs = [
        Record(
            id="p", words=tuple("the man ate an apple a dog chases the red ball".split()), segment=(0,) * 5 + (1,) * 6
        ),
        Record(id="s", words=tuple("she reads books .".split()), segment=(0,) * 4),
    ]
    parsed = parse_records(recs, nlp)
    assert [p.words for p in parsed] == [r.words for r in recs]
    p = parsed[0]
    assert len(p.head) == len(p.words) == len(p.deprel)
    seg = np.array(p.segment)
    for i, h in enumerate(p.head):  # every arc stays inside its segment
        assert h == -1 or seg[h] == seg[i]
    assert p.deprel[4] == "dobj" and p.head[4] == 2  # apple <-dobj- ate (spaCy's ClearNLP label)
    assert p.deprel[1] == "nsubj" and p.head[1] == 2
    assert sum(h == -1 for h in p.head) == 2  # one root per segment
    assert trees_of(recs, parsed) is parsed
    with pytest.raises(ValueError, match="does not match"):
        trees_of(recs, parsed[::-1])


def test_token_roles_come_first():
    assert ROLES[: len(TOKEN_ROLES)] == list(TOKEN_ROLES)
    assert ROLES[len(TOKEN_ROLES)] == "syntactic"


def test_score_store_notes_pairs_hidden_by_the_causal_mask(tmp_path):
    from headatlas.core.store import AttentionStore

    # BOS w0 w1 w2: w0 <-amod- w1 (head after its dependent: invisible from w0), w2 -> w1 (visible)
    seq = (np.array([SPECIAL_BOS, 0, 0, 0]), np.zeros(4, dtype=np.int64), np.array([-1, 0, 1, 2]))
    records = [
        Record(id="r0", words=tuple("abc"), segment=(0, 0, 0), head=(1, -1, 1), deprel=("amod", "root", "advmod"))
    ]
    _write_store(tmp_path / "s", [seq], kind="decoder")
    st = SieveSettings(relations=("amod", "advmod"))
    with AttentionStore(tmp_path / "s") as store:
        out = score_store(store, records, st)
        both = score_store(store, records, SieveSettings(relations=("amod", "advmod"), direction="both"))
    assert out["pairs_present"].tolist() == [1, 1, 2]
    assert out["pair_counts"].sum(0).tolist() == [0, 1, 1]
    assert "visible under the causal mask" in out["notes"]["syntactic_amod"]
    assert "syntactic_amod" not in both["notes"]  # head -> dependent sees it
    assert both["pair_counts"].sum(0).tolist() == [1, 1, 2]
