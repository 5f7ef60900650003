"""Map-free statistics of models in bfloat16 and float16 (``dtype:`` of a model): the model's layers run in its
dtype, the attention pass and every statistic in float32; the statistics stay within HALF_TOL of the same
model's in float32 (what the half-precision hidden states change), with the CPU attention pass and without."""

from __future__ import annotations

import pytest
import torch
from conftest import load_tiny
from unit.core.test_mapfree import TOL, mapfree_reducers, max_diff

from headatlas.core.extract import tokenize_records
from headatlas.core.models import decoder_bos, model_kind
from headatlas.core.reduce import fused_reduce

# largest difference from the float32 model (absolute for fractions and nats, relative above 1), docs/mapfree.md
# (tiny random models: measured 3.6e-5 in bfloat16, 3.6e-6 in float16)
HALF_TOL = {"bfloat16": 5e-4, "float16": 5e-5}


@pytest.mark.parametrize("name", ["bert", "llama"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_model_statistics_near_float32(name, dtype, tiny_models, tiny_loaded, ewt_records):
    """A tiny model loaded in ``dtype`` runs map-free and its statistics are within HALF_TOL of the float32
    model's (and not identical: the model did run in half precision)."""
    spec, model, tok, config = tiny_loaded(name)
    _, half, _, _ = load_tiny(name, tiny_models[name], dtype=dtype)
    assert next(half.parameters()).dtype == getattr(torch, dtype)
    kind = model_kind(config, spec)
    recs = list(ewt_records[:10])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    run = lambda m, **kw: fused_reduce(m, tokenized, mapfree_reducers(), 4, kind, recs, pad, name, **kw)  # noqa: E731
    ref = run(model, path="mapfree")
    got = {mode: run(half, path="mapfree", cpu_pass=mode) for mode in ("auto", "off")}
    diffs = {mode: max(max_diff(a, b) for a, b in zip(ref, g)) for mode, g in got.items()}
    assert 0 < max(diffs.values()) < HALF_TOL[dtype], diffs
    # the C pass and the torch path agree on the same half-precision q, k, v as in float32
    assert max(max_diff(a, b) for a, b in zip(got["auto"], got["off"])) < TOL
