"""Clark's surface statistics map-free (SurfaceReducer through a FreeLayer) equal the eager-fused ones: every
statistic within 1e-5, encoders and decoders, smoothed (the attention pass, or row blocks) and unsmoothed
entropies, the tiny models and (slow) MiniLM and SmolLM2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headatlas.clark.reducers import SurfaceReducer, surface_needs
from headatlas.clark.surface import STATS
from headatlas.core import cpu_pass
from headatlas.core.extract import tokenize_records
from headatlas.core.mapfree import FreeLayer, attention_lse, plan_feed
from headatlas.core.models import decoder_bos, model_kind
from headatlas.core.reduce import fused_reduce
from unit.core.test_mapfree import REAL, TOL, _batch, load_real, max_diff


def compare_surface(model, tokenized, kind, records, pad, name, smoothing, batch_size=4, cpu_pass="auto"):
    """(eager table, map-free table, max difference over every statistic); ``cpu_pass``: the map-free feed's."""
    run = lambda path: fused_reduce(  # noqa: E731
        model,
        tokenized,
        [SurfaceReducer(smoothing)],
        batch_size,
        kind,
        records,
        pad,
        name,
        path=path,
        cpu_pass=cpu_pass,
    )[0]
    eager, free = run("eager"), run("mapfree")
    return eager, free, max_diff(eager[STATS], free[STATS])


@pytest.mark.parametrize("name", ["bert", "electra", "gpt2", "llama"])
@pytest.mark.parametrize("smoothing", [1e-4, 0.05, 0.0])
@pytest.mark.parametrize("cpu_pass", ["auto", "off"])
def test_tiny_surface_mapfree_equals_eager(name, smoothing, cpu_pass, tiny_loaded, records):
    """Every surface statistic map-free within 1e-5 of eager-fused (sentence pairs included: two [SEP]s), with
    the CPU attention pass and without (off: the Python a GPU runs); a statistic undefined on one path (NaN) is
    undefined on the other."""
    spec, model, tok, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    tokenized, _ = tokenize_records(records, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    assert plan_feed(model, [SurfaceReducer(smoothing)], 64)[0] == "mapfree"
    eager, free, diff = compare_surface(model, tokenized, kind, records, pad, name, smoothing, cpu_pass=cpu_pass)
    assert diff < TOL, (name, smoothing, diff)
    # the statistics are not trivially equal: the smoothed entropy differs from the unsmoothed one
    assert eager["entropy"].notna().all() and eager["punct"].gt(0).any()
    if kind == "encoder":
        assert eager["sep_to_sep"].notna().all() and eager["next"].gt(0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_smoothed_row_entropy_in_blocks(causal):
    """The row-block entropy of the smoothed rows equals that of an explicit softmax, with grouped key
    heads, right padding and blocks of a few rows (a last block shorter)."""
    torch.manual_seed(0)
    lengths = [9, 6]
    batch = _batch(lengths)
    bsz, h, hk, n, d, scale, eps = 2, 6, 2, 9, 8, 0.5, 0.01
    q, k = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2
    allowed = batch.masks("cpu", causal)["allowed"]
    key_ok = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    mask = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    s = (q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2)) * scale + add
    a = torch.softmax(s, -1) * allowed[:, None].float()
    _, lse = attention_lse(q, k, k, add, False, scale)
    view = FreeLayer(q, k, lse, scale, batch, causal, {}, {}, None)
    kf = (
        torch.arange(1, n + 1)[None].expand(bsz, n) if causal else torch.tensor(lengths)[:, None].expand(bsz, n)
    ).double()
    af = allowed.float()
    offset = (af * (eps / kf).float()[:, :, None] + (1 - af))[:, None]
    smooth = offset + (1 - eps) * a  # 1 on the cells a row may not see: ln 1 = 0
    ref = -(smooth * smooth.log()).sum(-1)
    for cells in (2 * h * n * 4, 2**22):  # blocks of 4, 4, 1 rows; one block
        got = view.smoothed_entropy(eps, cells=cells)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert (got[1, :, 6:] == 0).all()  # padded rows
    if cpu_pass.library() is not None:  # the CPU attention pass computes them in its pass over the scores
        bias = torch.zeros(bsz, n).masked_fill(~key_ok, -math.inf)
        _, _, kernel = cpu_pass.attention_pass(q, k, k, bias, causal, scale, smoothing=eps)
        smoothed = (eps, kernel["smoothed_entropy"])
        view = FreeLayer(q, k, lse, scale, batch, causal, {}, {}, None, smoothed=smoothed)
        torch.testing.assert_close(view.smoothed_entropy(eps), ref, rtol=0, atol=1e-5)
        assert view.smoothed_entropy(eps) is not got and (view.smoothed_entropy(eps)[1, :, 6:] == 0).all()


def test_surface_needs():
    """Offsets as targets, no value pass, the entropy pass only without smoothing."""
    batch = _batch([5, 3])
    need = surface_needs(batch, False, 1e-4)
    assert need.entropy is False and need.smoothed_entropy == 1e-4
    assert set(need.targets) == {"offset:1", "offset:0", "offset:-1"}
    need = surface_needs(batch, True, 0.0)
    assert (
        need.entropy
        and need.smoothed_entropy is None
        and set(need.targets) == {"offset:0", "offset:-1"}
        and not need.values
        and not need.lower
    )


@pytest.mark.parametrize("causal", [False, True])
def test_fixed_key_mass(causal):
    """The attention to a few fixed keys per sequence, summed in weighted groups, equals the same sums over an
    explicit softmax (grouped heads, padding, keys in chunks), and stays finite when an invisible key (after i,
    or padding) scores far above the row's LSE."""
    torch.manual_seed(2)
    lengths = [8, 5]
    batch = _batch(lengths)
    bsz, h, hk, n, d, scale = 2, 6, 3, 8, 4, 0.5
    q, k = torch.randn(bsz, h, n, d), torch.randn(bsz, hk, n, d)
    k[0, :, 7] = 30 * q[0, ::2, 0]  # key 7 of sequence 0: a score of ~900 for query 0 (invisible under causal)
    k[1, :, 6] = 30 * q[1, ::2, 0]  # a padded key of sequence 1
    allowed = batch.masks("cpu", causal)["allowed"]
    key_ok = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    mask = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    s = (q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2)) * scale + add
    a = torch.softmax(s, -1) * allowed[:, None].float()
    _, lse = attention_lse(q, k, k, add, False, scale)
    view = FreeLayer(q, k, lse, scale, batch, causal, {}, {}, None)
    pos = torch.tensor([[0, 3, 7, 2], [4, 6, 1, 0]])
    w = torch.rand(2, 4, 2)
    ref = torch.einsum("bhit,btg->bhig", a.gather(3, pos[:, None, None].expand(bsz, h, n, 4)), w)
    for cells in (bsz * h * n, 2**22):  # one key at a time; all at once
        got = view.key_mass(pos, w, cells=cells)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, ref, rtol=0, atol=TOL)  # scores of ~900: float32 rounds them to ~6e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_surface_mapfree_equals_eager(name, tmp_path_factory, ewt_records):
    """MiniLM and SmolLM2 (real weights), 24 EWT sentences at 128 tokens: every surface statistic within 1e-5,
    smoothed (the default eps) and unsmoothed."""
    spec, model, tok, config = load_real(name, tmp_path_factory, 8)
    kind = model_kind(config, spec)
    recs = list(ewt_records[:24])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    for smoothing in (1e-4, 0.0):
        eager, _, diff = compare_surface(model, tokenized, kind, recs, pad, name, smoothing, batch_size=8)
        assert diff < TOL, (name, smoothing, diff)
        assert np.isfinite(eager["entropy"]).all()
