"""A model split over several parts (the model's ``device_map`` config key, accelerate's split as transformers loads
it; layers offloaded to disk) gives the same map-free statistics as the unsplit model: the feed takes each layer on
its own device, the inputs go where the embeddings run (tests/integration/test_device_map.py: the eager path and the encoders)."""

from __future__ import annotations

import pytest
from conftest import tiny_spec
from unit.core.test_mapfree import mapfree_reducers, max_diff

from headatlas.core.extract import tokenize_records
from headatlas.core.models import decoder_bos, load, model_kind
from headatlas.core.reduce import fused_reduce


@pytest.mark.parametrize("cpu_pass", ["auto", "off"])
def test_split_model_same_statistics(cpu_pass, tiny_models, tiny_loaded, ewt_records, tmp_path):
    """The embeddings and every other layer of the tiny Llama offloaded to disk: every map-free reducer's results
    equal the unsplit model's, with the C pass and without."""
    pytest.importorskip("accelerate")

    spec, model, tok, config = tiny_loaded("llama")
    n = config.num_hidden_layers
    device_map = {"embed_tokens": "disk", "norm": "cpu", "rotary_emb": "cpu"}
    device_map |= {f"layers.{i}": ("disk" if i % 2 else "cpu") for i in range(n)}
    split_spec = tiny_spec("llama", tiny_models["llama"], device_map=device_map, offload_folder=str(tmp_path))
    split, _, _ = load(split_spec, device="cpu")
    assert "disk" in split.hf_device_map.values()
    kind = model_kind(config, spec)
    recs = list(ewt_records[:8])
    tokenized, _ = tokenize_records(recs, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    run = lambda m: fused_reduce(  # noqa: E731
        m, tokenized, mapfree_reducers(), 4, kind, recs, pad, "llama", path="mapfree", cpu_pass=cpu_pass
    )
    assert max(max_diff(a, b) for a, b in zip(run(model), run(split))) < 1e-6
