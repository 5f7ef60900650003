"""Pande's role registry (headatlas.pande.roles): the one place the roles and their order are written.

A new role is one registry entry: a throwaway ``self`` role (attention to the query's own token) registered in
a copy of the registry gets its exact score on hand maps, eager and map-free, with no other code changed; the
copies the atlas and the ablation keep (they may not import a paper package) equal the registry's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml
from conftest import REPO
from integration.test_mapfree_pande import corpus, run_both

from headatlas.ablation.analysis import AblationSettings
from headatlas.atlas.analysis import PANDE_ROLES_MAIN
from headatlas.atlas.figures import ROLE_MARKERS
from headatlas.core.layer_view import feed_layer
from headatlas.core.reduce import padded
from headatlas.core.reducer import FeedInfo, ReduceError
from headatlas.pande.figures import ordered_roles
from headatlas.pande.reducers import SieveReducer
from headatlas.pande.roles import (
    ROLES,
    TOKEN_ROLES,
    Arcs,
    Band,
    Role,
    check_registry,
    figure_order,
    main_roles,
    role_names,
)
from headatlas.pande.sieves import SieveSettings, role_notes
from unit.core.test_reduce import hand_batch


def with_self(registry=ROLES, main: int = 0) -> dict[str, Role]:
    """A copy of ``registry`` with a ``self`` role (the query's own token) before the syntactic role."""
    assert "self" not in registry, "the registry has a real self role: give this throwaway another name"
    *tok, arcs = registry
    out = {k: registry[k] for k in tok}
    out["self"] = Role(Band((0,)), "the query's own token", main=main)
    out[arcs] = registry[arcs]
    return out


def self_maps(lengths, causal: bool, p: float = 0.5) -> list[np.ndarray]:
    """One head per sequence: p on the query's own token, the rest spread evenly over the other visible keys
    (row 0 of a causal map sees only itself)."""
    out = []
    for n in lengths:
        a = np.zeros((1, n, n), dtype=np.float32)
        for i in range(n):
            keys = [j for j in range(n) if j != i and (j < i or not causal)]
            a[0, i, i] = p if keys else 1.0
            a[0, i, keys] = (1 - p) / max(len(keys), 1)
        out.append(a)
    return out


def expected_self(n: int, causal: bool, p: float = 0.5) -> float:
    """b_i = A_ii / (1 / k_i): p n (encoder, k_i = n); 1 on row 0 and p (i + 1) after it (causal, k_i = i + 1);
    the sentence score is their mean."""
    if not causal:
        return p * n
    return (1.0 + sum(p * (i + 1) for i in range(1, n))) / n


def feed_hand(reducer, causal: bool):
    batch, seqs, _ = hand_batch()
    lengths = [len(s[0]) for s in seqs]
    info = FeedInfo(n_sequences=len(seqs), n_layers=1, n_heads=1, model_kind="decoder" if causal else "encoder")
    reducer.start(info)
    feed_layer([reducer], info, 0, padded(self_maps(lengths, causal)), batch)
    return reducer.result(), lengths


@pytest.mark.parametrize("causal", [False, True])
def test_a_new_role_is_one_registry_entry(causal):
    """The ``self`` role's score is exact on hand maps; every other column equals the real registry's."""
    st = SieveSettings(relations=("nsubj", "amod"))
    reg = with_self()
    got, lengths = feed_hand(SieveReducer(st, registry=reg), causal)
    base, _ = feed_hand(SieveReducer(st), causal)
    assert got["roles"] == [*TOKEN_ROLES, "self", "syntactic", "syntactic_nsubj", "syntactic_amod"]
    col = got["roles"].index("self")
    for b, n in enumerate(lengths):
        assert got["scores"][b, 0, 0, col] == pytest.approx(expected_self(n, causal), rel=1e-6)
    others = [got["roles"].index(r) for r in base["roles"]]
    np.testing.assert_array_equal(got["scores"][..., others], base["scores"])
    assert got["notes"] == base["notes"]


@pytest.mark.parametrize("causal", [False, True])
def test_a_next_token_role_and_a_band_the_causal_mask_cuts(causal):
    """A ``next`` role (offset +1): 0.5 n / (n - 1) on the hand maps of an encoder (the last token has no next
    one, so it is no query); under a causal mask the band is empty: NaN and the generic note."""
    st = SieveSettings(relations=("nsubj",))
    *tok, arcs = ROLES
    reg = {**{k: ROLES[k] for k in tok}, "next": Role(Band((1,)), "the next token"), arcs: ROLES[arcs]}
    got, lengths = feed_hand(SieveReducer(st, registry=reg), causal)
    col = got["roles"].index("next")
    for b, n in enumerate(lengths):
        if causal:
            assert np.isnan(got["scores"][b, 0, 0, col])
        else:
            assert got["scores"][b, 0, 0, col] == pytest.approx(0.5 * n / (n - 1), rel=1e-6)
    assert (got["notes"].get("next") == "corpus ?: no query token has a next sieve") == causal


def test_a_new_role_has_notes_figure_order_and_main_place():
    """An empty new role gets the generic note (or its own); main = k puts it among the main roles."""
    st = SieveSettings(relations=("nsubj",))
    reg = with_self()
    roles = role_names(st.relations, reg)
    scores = np.full((2, 1, 1, len(roles)), 1.0)
    scores[:, :, :, roles.index("self")] = np.nan
    notes = role_notes(scores, roles, np.ones(2, bool), np.ones(2, np.int64), st, "c", "encoder", reg)
    assert notes == {"self": "corpus c: no query token has a self sieve"}
    reg["self"] = dataclasses.replace(reg["self"], empty="corpus {corpus}: {model_kind} without itself")
    notes = role_notes(scores, roles, np.ones(2, bool), np.ones(2, np.int64), st, "c", "encoder", reg)
    assert notes == {"self": "corpus c: encoder without itself"}
    assert figure_order(reg) == [*figure_order(), "self"]
    assert main_roles(with_self(main=5)) == [*main_roles(), "self"]


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_new_role_is_map_free_too(name, tiny_loaded, ewt_records):
    """The ``self`` role (one offset target) map-free equals the eager path on the tiny models, pairs included."""
    spec, model, tok, config = tiny_loaded(name)
    st = SieveSettings()
    recs = corpus(ewt_records, n_single=4, n_pairs=3)
    e, f = run_both(model, tok, config, spec, recs, lambda: [SieveReducer(st, registry=with_self())])
    (e,), (f,) = e, f
    col = e["roles"].index("self")
    assert f["roles"] == e["roles"] and np.isfinite(e["scores"][..., col]).all()
    np.testing.assert_allclose(f["scores"], e["scores"], rtol=0, atol=1e-5, equal_nan=True)


def test_score_columns_and_figure_order_are_the_outputs_order():
    """The registry's order is the scores' (and heads.tsv's) column order; the figures list the main roles first.
    Pinned on purpose: a new role changes the outputs, and this list with them."""
    assert role_names(("nsubj", "obj")) == [
        "local", "delimiter", "delimiter_cls", "delimiter_sep", "block", "syntactic", "syntactic_nsubj",
        "syntactic_obj",
    ]  # fmt: skip
    assert main_roles() == ["local", "syntactic", "delimiter", "block"]
    assert figure_order() == ["local", "syntactic", "delimiter", "block", "delimiter_cls", "delimiter_sep"]
    assert ordered_roles(["syntactic_obj", "block", "delimiter_sep", "local"]) == [
        "local", "block", "delimiter_sep", "syntactic_obj"
    ]  # fmt: skip


def test_atlas_and_ablation_copies_equal_the_registry():
    """The atlas and the ablation may not import pande: their main-role copies are checked here."""
    assert PANDE_ROLES_MAIN == main_roles()
    assert list(ROLE_MARKERS) == main_roles()
    schema = yaml.safe_load((REPO / "workflow/schemas/ablation.schema.yaml").read_text())
    assert schema["properties"]["pande_roles"]["default"] == main_roles()
    default = AblationSettings.__dataclass_fields__["pande_roles"].default
    assert default is dataclasses.MISSING or list(default) == main_roles()


def test_a_store_of_other_roles_is_refused():
    """The reducer's params do not name the roles: a result saved with other roles (an older registry) is an
    error naming both lists, not a silent table without the new role."""
    st = SieveSettings(relations=("nsubj",))
    r = SieveReducer(st)
    result, _ = feed_hand(r, False)
    arrays = r.to_arrays(result)
    assert SieveReducer.from_arrays(arrays)["roles"] == result["roles"]
    keep = [i for i, role in enumerate(result["roles"]) if role != "delimiter_sep"]
    old = dict(arrays, roles=arrays["roles"][keep], scores=arrays["scores"][..., keep])
    with pytest.raises(ReduceError, match="reduced with roles .* the registry .* rerun the extraction"):
        SieveReducer.from_arrays(old)


def test_registry_checks():
    *tok, arcs = ROLES
    with pytest.raises(ValueError, match="last in the registry"):
        check_registry({arcs: ROLES[arcs], **{k: ROLES[k] for k in tok}})
    with pytest.raises(ValueError, match="last in the registry"):
        check_registry({**ROLES, "syntactic2": Role(Arcs(), "again")})
    with pytest.raises(ValueError, match="share a main place"):
        check_registry(with_self(main=1))
    with pytest.raises(ValueError, match="last in the registry"):
        SieveReducer(registry={k: ROLES[k] for k in tok})


def test_band_offsets():
    assert Band().keys(2, False) == [-2, -1, 0, 1, 2]
    assert Band().keys(2, True) == [-2, -1, 0]
    assert Band((1, 0, -3)).keys(9, True) == [-3, 0]
