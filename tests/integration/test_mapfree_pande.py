"""Pande's sieves map-free (headatlas.pande.reducers, headatlas.core.mapfree): every role and every setting the
schema allows equal to the eager-fused reference on the tiny models (single sentences, sentence pairs with trees,
encoders and decoders), and on MiniLM and SmolLM2 (slow)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from unit.core.test_mapfree import REAL, TOL, load_real, max_diff

from headatlas.core.data import Record
from headatlas.core.extract import tokenize_records
from headatlas.core.mapfree import plan_feed
from headatlas.core.models import decoder_bos, model_kind
from headatlas.core.reduce import fused_reduce
from headatlas.detectors.reducers import DetectorReducer
from headatlas.pande.reducers import SieveReducer, view_key_masses
from headatlas.pande.sieves import SieveSettings
from headatlas.position.reducers import PositionReducer

# every setting of workflow/schemas/pande.schema.yaml that changes the scores
SETTINGS = {
    "default": SieveSettings(),
    "window0_head_to_dep": SieveSettings(window=0, direction="head_to_dep", block_entropy=False),
    "window5_both": SieveSettings(window=5, direction="both"),
    "relations": SieveSettings(
        window=1,
        relations=("nsubj", "det", "case", "punct"),
        labels={"nsubj": ("nsubj", "nsubj:pass")},
        direction="both",
    ),
}


def pair_of(a: Record, b: Record) -> Record:
    """Two sentences as one pair record (segment A, segment B) with both trees."""
    shift = len(a.words)
    return Record(
        id=f"{a.id}+{b.id}",
        words=a.words + b.words,
        segment=(0,) * shift + (1,) * len(b.words),
        head=a.head + tuple(h + shift if h >= 0 else -1 for h in b.head),
        deprel=a.deprel + b.deprel,
    )


def corpus(ewt_records, n_single=6, n_pairs=5) -> list[Record]:
    """Single sentences and pairs of the shortest other sentences mixed (a batch may hold both, pairs only or
    none; the pairs fit the tiny models' 64 tokens)."""
    recs = list(ewt_records)
    short = sorted(recs[n_single:], key=lambda r: len(r.words))
    pairs = [pair_of(short[2 * i], short[2 * i + 1]) for i in range(n_pairs)]
    return recs[:n_single] + pairs


def run_both(model, tok, config, spec, recs, reducers, batch_size=4, cpu_pass="auto"):
    kind = model_kind(config, spec)
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out = {}
    for path in ("eager", "mapfree"):
        out[path] = fused_reduce(
            model, tokenized, reducers(), batch_size, kind, recs, pad, spec.name, "t", path=path, cpu_pass=cpu_pass
        )
    return out["eager"], out["mapfree"]


def sieve_diff(e: dict, f: dict) -> float:
    for k in ("pair_counts", "pairs_present", "is_pair", "has_trees"):
        np.testing.assert_array_equal(e[k], f[k], err_msg=k)
    assert e["roles"] == f["roles"] and e["notes"] == f["notes"]
    return max_diff(e["scores"], f["scores"])


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name", ["bert", "electra", "gpt2", "llama"])
@pytest.mark.parametrize("cpu_pass", ["auto", "off"])
def test_tiny_sieves_mapfree_equal_eager(name, setting, cpu_pass, tiny_loaded, ewt_records):
    """Every role of the sieves, map-free, within 1e-5 of the eager path, with the CPU attention pass and without
    (off: the Python a GPU runs): pairs (block, with and without the entropy factor), syntactic roles in every
    direction, windows 0..5, custom relations and labels."""
    spec, model, tok, config = tiny_loaded(name)
    st = SETTINGS[setting]
    recs = corpus(ewt_records)
    assert plan_feed(model, [SieveReducer(st)], 64)[0] == "mapfree"
    (e,), (f,) = run_both(model, tok, config, spec, recs, lambda: [SieveReducer(st)], cpu_pass=cpu_pass)
    assert e["is_pair"].sum() == 5 and e["has_trees"].all()
    roles = e["roles"]
    present = ~np.isnan(e["scores"][:, 0, 0])  # [N, R]: the fixture exercises every role
    must = ["local", "delimiter", "delimiter_cls", "block", "syntactic"]
    if model_kind(config, spec) == "encoder":
        must.append("delimiter_sep")
    assert all(present[:, roles.index(r)].any() for r in must), roles
    assert sieve_diff(e, f) < TOL


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_sieves_share_one_feed(name, tiny_loaded, ewt_records):
    """Two sieve reducers with other settings, the position statistics and the detectors in one map-free feed
    (shared target names: offset:<o>, key:0): each equals its eager result."""
    spec, model, tok, config = tiny_loaded(name)
    a, b = SETTINGS["default"], SETTINGS["window5_both"]

    def reducers():
        return [SieveReducer(a), PositionReducer(3, (0, 1, 4, 16)), SieveReducer(b), DetectorReducer(seed=2)]

    e, f = run_both(model, tok, config, spec, corpus(ewt_records, 5, 3), reducers, batch_size=3)
    assert sieve_diff(e[0], f[0]) < TOL and sieve_diff(e[2], f[2]) < TOL
    assert max_diff(e[1], f[1]) < TOL and max_diff(e[3], f[3]) < TOL
    assert not np.allclose(np.nan_to_num(e[0]["scores"]), np.nan_to_num(e[2]["scores"]))  # the settings differ


def test_view_key_masses_per_group():
    """A [CLS] A [SEP] B [SEP] pair and a shorter single sentence: view_key_masses sums the attention to the
    special tokens per group ([CLS]/BOS, [SEP]), each sequence its own."""
    from headatlas.core.mapfree import FreeLayer
    from headatlas.core.reducer import ReduceBatch

    specials = [np.array([1, 0, 0, 2, 0, 2]), np.array([1, 0, 2])]
    rows = [{"word": np.arange(len(s)), "special": s, "segment": np.zeros(len(s), dtype=np.int64),
             "piece": np.array(["p"] * len(s), dtype=object)} for s in specials]  # fmt: skip
    batch = ReduceBatch.from_rows(np.arange(2), rows, np.arange(2), np.array([6, 3]))
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)
    allowed = batch.masks("cpu", False)["allowed"]
    s = (q @ k.transpose(-1, -2)).masked_fill(~allowed[:, None], -torch.inf)
    lse = torch.logsumexp(s, -1)
    a = torch.nan_to_num(torch.softmax(s, -1)) * batch.masks("cpu", False)["valid"][:, None, :, None]
    view = FreeLayer(q, k, lse, 1.0, batch, False, {}, {}, None)
    got = view_key_masses(view, batch)
    cls = a[..., 0]
    sep = torch.stack([a[0, :, :, 3] + a[0, :, :, 5], a[1, :, :, 2]])
    torch.testing.assert_close(got, torch.stack([cls, sep], -1), rtol=0, atol=1e-6)


PAIR_SETTINGS = ("default", "window0_head_to_dep", "window5_both")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_sieves_mapfree_equal_eager(name, tmp_path_factory, ewt_records):
    """MiniLM and SmolLM2 (real weights) on EWT sentences and pairs of them: every role, three settings in one
    feed, map-free within 1e-5 of eager-fused."""
    spec, model, tok, config = load_real(name, tmp_path_factory, 8)
    recs = corpus(ewt_records, 12, 12)
    e, f = run_both(model, tok, config, spec, recs, lambda: [SieveReducer(SETTINGS[s]) for s in PAIR_SETTINGS], 8)
    diffs = {s: sieve_diff(a, b) for s, a, b in zip(PAIR_SETTINGS, e, f)}
    assert max(diffs.values()) < TOL, diffs
