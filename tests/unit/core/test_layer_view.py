"""The layer view's two backends (headatlas.core.layer_view): every primitive of a MapsLayer built from explicit
softmax maps equals the FreeLayer's from the same q, k and LSE, on random scores of every mask kind (an encoder's
key padding, a decoder's causal mask with and without padding, a one-token sequence), with grouped key heads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headatlas.core.layer_view import LayerPlan, MapsLayer, offset_target
from headatlas.core.mapfree import FreeLayer, attention_lse, blocked_attention
from headatlas.core.reducer import Needs, ReduceBatch

TOL = 1e-5
MASKS = {  # name: (causal, lengths)
    "encoder, padded": (False, [9, 6, 1]),
    "decoder, padded": (True, [9, 6, 1]),
    "decoder, unpadded": (True, [8, 8]),
}


def _batch(lengths):
    rows = [{"word": np.arange(m), "special": np.zeros(m, dtype=np.int64), "segment": np.zeros(m, dtype=np.int64),
             "piece": np.array([f"p{i % 3}" for i in range(m)], dtype=object)} for m in lengths]  # fmt: skip
    return ReduceBatch.from_rows(np.arange(len(lengths)), rows, np.arange(len(lengths)), np.array(lengths))


def both_views(causal, lengths, seed=0, h=6, hk=2, d=8, scale=0.4):
    """(MapsLayer, FreeLayer, maps) of one random layer with the same declarations: value and lower columns,
    the entropy, offset / fixed-key / arbitrary targets (-1 included)."""
    torch.manual_seed(seed)
    batch = _batch(lengths)
    bsz, n = len(lengths), max(lengths)
    q, k = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2
    key_ok = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    mask = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    s = (q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2)) * scale + add
    maps = torch.softmax(s, -1)  # padded rows: a distribution over the real keys, as a fused feed hands them
    rng = np.random.default_rng(seed)
    pos = torch.arange(n, dtype=torch.float32)[None, :, None].expand(bsz, n, 1)
    needs = Needs(
        entropy=True,
        values={"pos": pos, "r": torch.as_tensor(rng.random((bsz, n, 2)), dtype=torch.float32)},
        lower={"one_pos": torch.cat([torch.ones_like(pos), pos], -1)},
        targets={
            "offset:-1": offset_target(batch, -1),
            "offset:2": offset_target(batch, 2),
            "key:0": np.zeros((bsz, n), dtype=np.int64),
            "random": rng.integers(-1, n, (bsz, n)),
        },
    )
    plan = LayerPlan.of_needs([needs], causal, "cpu")
    _, lse = attention_lse(q, k, k, add, False, scale)
    lcols = None if plan.lower is None else plan.lower[:, None]
    _, _, got = blocked_attention(q, k, k, add, False, scale, plan.values[:, None], lcols, True)
    values, lower = plan.columns(got["values"], got.get("lower"))
    free = FreeLayer(q, k, lse, scale, batch, causal, values, lower, got["entropy"], plan.targets)
    return MapsLayer(maps, batch, causal, plan), free, maps


@pytest.mark.parametrize("kind", MASKS)
def test_the_two_backends_agree(kind):
    causal, lengths = MASKS[kind]
    view, free, maps = both_views(causal, lengths)
    bsz, h, n = view.shape
    assert free.shape == view.shape and view.maps is maps
    for name in ("offset:-1", "offset:2", "key:0", "random"):
        torch.testing.assert_close(view.target(name), free.target(name), rtol=0, atol=TOL, msg=name)
    for name in ("pos", "r"):
        torch.testing.assert_close(view.value(name), free.value(name), rtol=0, atol=1e-4, msg=name)
    torch.testing.assert_close(view.lower("one_pos"), free.lower("one_pos"), rtol=0, atol=1e-4)
    torch.testing.assert_close(view.entropy(), free.entropy(), rtol=0, atol=TOL)
    torch.testing.assert_close(view.row_sum(), free.row_sum(), rtol=0, atol=TOL)
    for eps in (1e-4, 0.05):
        torch.testing.assert_close(view.smoothed_entropy(eps), free.smoothed_entropy(eps), rtol=0, atol=TOL)
    torch.testing.assert_close(view.rows(), free.rows(), rtol=0, atol=TOL)
    torch.testing.assert_close(view.rows(2, 5, [1], keys=6), free.rows(2, 5, [1], keys=6), rtol=0, atol=TOL)
    for (sv, bv), (sf, bf) in zip(view.row_blocks(cells=bsz * h * n * 4), free.row_blocks(cells=bsz * h * n * 4)):
        assert sv == sf
        torch.testing.assert_close(bv, bf, rtol=0, atol=TOL)
    query = np.array([[0, n - 1, -1]] * bsz)
    torch.testing.assert_close(view.query_rows(query), free.query_rows(query), rtol=0, atol=TOL)
    pos = torch.tensor([[0, 3, n - 1]] * bsz)
    w = torch.rand(bsz, 3, 2)
    for cells in (1, 2**22):  # one key per chunk, and all at once
        torch.testing.assert_close(view.key_mass(pos, w, cells), free.key_mass(pos, w, cells), rtol=0, atol=TOL)


@pytest.mark.parametrize("kind", MASKS)
def test_maps_view_is_exact_on_its_maps(kind):
    """Each MapsLayer primitive is the plain sum over its maps (0 on padded rows and unseen cells)."""
    causal, lengths = MASKS[kind]
    view, _, maps = both_views(causal, lengths, seed=1)
    bsz, h, n = view.shape
    allowed = view.batch.masks("cpu", causal)["allowed"][:, None].float()
    a = maps * allowed
    i = torch.arange(n)
    prev = torch.stack([a[..., r, r - 1] if r else a[..., 0, 0] * 0 for r in range(n)], -1)
    torch.testing.assert_close(view.target("offset:-1"), prev, rtol=0, atol=0)
    torch.testing.assert_close(view.target("key:0"), a[..., 0], rtol=0, atol=0)
    torch.testing.assert_close(view.value("pos")[..., 0], (a * i.float()).sum(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(view.entropy(), torch.special.entr(a).sum(-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(view.row_sum(), a.sum(-1), rtol=0, atol=0)
    real = torch.tensor(lengths)[:, None] > i
    assert (view.entropy()[~real[:, None].expand(bsz, h, n)] == 0).all()  # padded rows
    rows = view.rows(slot="test")
    rows += 1  # a scratch copy: the view's maps are untouched
    torch.testing.assert_close(view.rows(), a, rtol=0, atol=0)
