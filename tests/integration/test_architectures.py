"""Every row of the architecture table (headatlas.core.models.ARCHITECTURES) on a tiny random model.

Each model type is built from its own transformers Config class (2 layers, 4 query heads, width
32, the fixture tokenizers: WordPiece for encoders, byte-level BPE for decoders), written with
``save_pretrained`` and loaded back through ``headatlas.core.models.load``; then extracted into a
store, its per-head vectors recomputed independently (sum_j A_ij v_j from the stored maps and the
value projection's output), and Clark's surface statistics computed on the store.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, tiny_llama_config, tiny_spec

from headatlas.circuits.weights import LAYOUTS
from headatlas.core.data import Record
from headatlas.core.extract import ExtractSettings, head_output_modules
from headatlas.core.models import (
    ARCHITECTURES,
    ModelError,
    No,
    architecture,
    architecture_markdown,
    architecture_module,
    decoder_bos,
    embedding_parameters,
    load,
    model_kind,
    word_embeddings,
)
from headatlas.core.store import AttentionStore

WIDTH, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 37, 128


def _encoder(vocab: int, pad: int, **kw) -> dict:
    base = dict(
        vocab_size=vocab,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POSITIONS,
        pad_token_id=pad,
    )
    return {**base, **kw}


def _decoder(vocab: int, eot: int, **kw) -> dict:
    base = dict(
        vocab_size=vocab,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=POSITIONS,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
    )
    return {**base, **kw}


def _gpt(vocab: int, eot: int, **kw) -> dict:
    return dict(
        vocab_size=vocab,
        n_layer=LAYERS,
        n_head=HEADS,
        n_embd=WIDTH,
        n_positions=POSITIONS,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        **kw,
    )


_DEBERTA = dict(relative_attention=True, position_biased_input=False, pos_att_type=["c2p", "p2c"], type_vocab_size=0)

# model type -> Config kwargs (vocabulary size, pad / end-of-text id); realistic options where a
# family has them (sliding windows, grouped-query, head_dim != width / heads, shared layers).
TINY_CONFIGS = {
    "bert": lambda v, s: _encoder(v, s),
    "electra": lambda v, s: _encoder(v, s, embedding_size=16),
    "roberta": lambda v, s: _encoder(v, s, type_vocab_size=1),
    "xlm-roberta": lambda v, s: _encoder(v, s, type_vocab_size=1),
    "deberta": lambda v, s: _encoder(v, s, **_DEBERTA),
    "deberta-v2": lambda v, s: _encoder(
        v, s, **_DEBERTA, position_buckets=16, share_att_key=True, norm_rel_ebd="layer_norm"
    ),
    "mpnet": lambda v, s: _encoder(v, s),
    "distilbert": lambda v, s: dict(
        vocab_size=v,
        dim=WIDTH,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=FFN,
        max_position_embeddings=POSITIONS,
        pad_token_id=s,
    ),
    "albert": lambda v, s: _encoder(v, s, embedding_size=16, num_hidden_layers=4, num_hidden_groups=2),
    "gpt2": lambda v, s: _gpt(v, s),
    "openai-gpt": lambda v, s: dict(vocab_size=v, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, n_positions=POSITIONS),
    "gptj": lambda v, s: _gpt(v, s, rotary_dim=4),
    "gpt_neox": lambda v, s: _decoder(v, s),
    "opt": lambda v, s: dict(
        vocab_size=v,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        ffn_dim=FFN,
        word_embed_proj_dim=WIDTH,
        max_position_embeddings=POSITIONS,
        bos_token_id=s,
        eos_token_id=s,
        pad_token_id=s,
    ),
    "phi": lambda v, s: _decoder(v, s),
    "llama": lambda v, s: tiny_llama_config(v, s, max_position_embeddings=POSITIONS).to_dict(),
    "mistral": lambda v, s: _decoder(v, s, num_key_value_heads=2, sliding_window=8),
    "phi3": lambda v, s: _decoder(v, s, num_key_value_heads=2),
    "gemma": lambda v, s: _decoder(v, s, num_key_value_heads=1, head_dim=8),
    "gemma2": lambda v, s: _decoder(
        v, s, num_key_value_heads=2, head_dim=8, sliding_window=8, attn_logit_softcapping=50.0
    ),
    "gemma3_text": lambda v, s: _decoder(
        v,
        s,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "qwen2": lambda v, s: _decoder(v, s, num_key_value_heads=2),
    "qwen3": lambda v, s: _decoder(v, s, num_key_value_heads=2, head_dim=8),
    "olmo": lambda v, s: _decoder(v, s),
}


def _neox(out, model, layer):  # fused per head: [q_h | k_h | v_h] for every head
    d = model.config.hidden_size // model.config.num_attention_heads
    return out.reshape(*out.shape[:-1], -1, 3 * d)[..., 2 * d :].flatten(-2)


def _deberta(out, model, layer):  # fused per head like GPT-NeoX, plus a separate value bias
    return _neox(out, model, layer) + model.encoder.layer[layer].attention.self.v_bias


def _phi3(out, model, layer):  # [q (H d) | k (KV d) | v (KV d)]
    c = model.config
    d = c.hidden_size // c.num_attention_heads
    return out[..., (c.num_attention_heads + c.num_key_value_heads) * d :]


def _c_attn(out, model, layer):  # GPT-2's Conv1D [q | k | v]
    return out[..., 2 * model.config.hidden_size :]


_V = "layers.{layer}.self_attn.v_proj"
# model type -> (value projection module path, its output -> the values [.., KV * head_dim])
VALUES = {
    **{t: ("encoder.layer.{layer}.attention.self.value", None) for t in ("bert", "electra", "roberta", "xlm-roberta")},
    "deberta": ("encoder.layer.{layer}.attention.self.in_proj", _deberta),
    "deberta-v2": ("encoder.layer.{layer}.attention.self.value_proj", None),
    "mpnet": ("encoder.layer.{layer}.attention.attn.v", None),
    "distilbert": ("transformer.layer.{layer}.attention.v_lin", None),
    "albert": ("encoder.albert_layer_groups.{layer}.albert_layers.0.attention.value", None),
    "gpt2": ("h.{layer}.attn.c_attn", _c_attn),
    "openai-gpt": ("h.{layer}.attn.c_attn", _c_attn),
    "gptj": ("h.{layer}.attn.v_proj", None),
    "gpt_neox": ("layers.{layer}.attention.query_key_value", _neox),
    "opt": ("decoder.layers.{layer}.self_attn.v_proj", None),
    "phi": (_V, None),
    "phi3": ("layers.{layer}.self_attn.qkv_proj", _phi3),
    **{t: (_V, None) for t in ("llama", "mistral", "gemma", "gemma2", "gemma3_text", "qwen2", "qwen3", "olmo")},
}


@pytest.fixture(scope="module")
def arch_records(ewt_records):
    pair = Record(
        id="pair-0", words=("The", "court", "ruled", ".", "It", "was", "final", "."), segment=(0,) * 4 + (1,) * 4
    )
    return list(ewt_records[:5]) + [pair]


@pytest.fixture(scope="module")
def arch_model(tmp_path_factory, bert_vocab_file, bpe_tokenizer_object):
    """model type -> (spec, model, tokenizer, config, directory), built and loaded once."""
    from tiny_workflow import BPE_SPECIAL
    from transformers import CONFIG_MAPPING, AutoModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("arch")
    wp = BertTokenizerFast(vocab=str(bert_vocab_file), do_lower_case=True)
    bpe = bpe_tokenizer_object
    cache: dict = {}

    def get(model_type: str):
        if model_type not in cache:
            encoder = ARCHITECTURES[model_type].kind == "encoder"
            tok = wp if encoder else bpe
            special = tok.pad_token_id if encoder else tok.convert_tokens_to_ids(BPE_SPECIAL)
            config = CONFIG_MAPPING[model_type](**TINY_CONFIGS[model_type](len(tok), special))
            torch.manual_seed(sorted(ARCHITECTURES).index(model_type))
            model = AutoModel.from_config(config)
            with torch.no_grad():  # biases that start at zero would hide a missing term
                for name, p in model.named_parameters():
                    if p.dim() == 1 and not name.endswith("weight"):
                        p.normal_(0, 0.1)
            d = root / model_type
            model.save_pretrained(d)
            tok.save_pretrained(d)
            spec = tiny_spec(model_type, d, batch_size=3)
            model, tokenizer, config = load(spec, device="cpu")
            cache[model_type] = (spec, model, tokenizer, config, d)
        return cache[model_type]

    return get


@pytest.fixture(scope="module")
def arch_store(tmp_path_factory, arch_model, arch_records):
    """model type -> extraction directory (maps and representations) of ``arch_records``."""
    from headatlas.core.extract import extract

    root = tmp_path_factory.mktemp("arch_store")
    cache: dict = {}

    def get(model_type: str) -> Path:
        if model_type not in cache:
            spec, model, tokenizer, config, _ = arch_model(model_type)
            counts = extract(
                arch_records,
                spec,
                model,
                tokenizer,
                config,
                root / model_type,
                ExtractSettings(overflow="truncate"),
                meta={"corpus": "t"},
            )
            assert counts["sequences"] == len(arch_records)
            cache[model_type] = root / model_type
        return cache[model_type]

    return get


def test_every_row_has_a_tiny_model_and_a_value_path():
    assert set(TINY_CONFIGS) == set(ARCHITECTURES) == set(VALUES)
    for mt, arch in ARCHITECTURES.items():
        assert arch.kind in ("encoder", "decoder"), mt
        assert "{layer}" in arch.head_output, mt
        assert arch.embeddings and (arch.lm_head is None or arch.lm_head), mt
        assert not (arch.kind == "encoder" and arch.bos), mt
        assert arch.mapfree is None or isinstance(arch.mapfree, No), mt  # every capability: yes, or no with why
        assert arch.fused is None or isinstance(arch.fused, No), mt
        assert arch.weight_layout in LAYOUTS or isinstance(arch.weight_layout, No), mt


def test_unknown_model_type_fails_at_load_listing_the_supported_ones(tmp_path):
    from transformers import BloomConfig

    BloomConfig(vocab_size=10, hidden_size=8, n_layer=1, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ModelError) as err:
        load(tiny_spec("mystery", tmp_path), device="cpu")
    msg = str(err.value)
    assert "'mystery'" in msg and "'bloom'" in msg and "bert, " in msg and "gemma3_text" in msg
    with pytest.raises(ModelError, match="supported types"):
        architecture("t5")


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_extraction_head_vectors_and_surface(model_type, arch_model, arch_store):
    from reference.surface import surface_table

    spec, model, tokenizer, config, _ = arch_model(model_type)
    arch = ARCHITECTURES[model_type]
    assert model.config._attn_implementation == "eager"
    assert model_kind(config, spec) == arch.kind
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    kv = arch.kv_heads(config)
    with AttentionStore(arch_store(model_type)) as st:
        assert (st.n_layers, st.n_heads) == (n_layers, n_heads)  # query heads, also under grouped-query attention
        assert st.meta["model_kind"] == arch.kind and st.meta["model_type"] == model_type
        assert st.meta["rep_position"] == arch.rep_position
        bos = decoder_bos(tokenizer, config, spec)
        if bos is not None:
            assert all(st.tokens(k)["input_ids"][0] == bos for k in range(len(st)))
        vectors = [st.head_vectors(layer) for layer in range(n_layers)]
        head_dim = vectors[0].shape[-1]
        proj = head_output_modules(model, n_layers)
        assert (type(proj[0]).__name__ == "Conv1D") == arch.conv1d  # the weight layout rep_shapes reads
        assert len(set(map(id, proj))) == (config.num_hidden_groups if arch.shared_layers else n_layers)
        assert vectors[0].shape == (len(st), n_heads, head_dim)
        assert head_dim == getattr(config, "head_dim", None) or head_dim * n_heads == config.hidden_size
        assert st.hidden(0).shape == (len(st), config.hidden_size)
        assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in vectors)

        # the values v_j of every layer, from the value projection's output (call order = layer order)
        path, pick = VALUES[model_type]
        pattern = re.compile(r"(?:^|\.)" + re.escape(path).replace(re.escape("{layer}"), r"\d+") + "$")
        values: list = []
        mods = [m for n, m in model.named_modules() if pattern.search(n)]
        hooks = [m.register_forward_hook(lambda mod, args, out: values.append(out)) for m in mods]
        use_types = getattr(config, "type_vocab_size", 0) > 1
        try:
            for k in range(3):
                t = st.tokens(k)
                values.clear()
                inputs = {"input_ids": torch.as_tensor(t["input_ids"])[None]}
                if use_types:
                    inputs["token_type_ids"] = torch.as_tensor(t["segment"])[None]
                with torch.no_grad():
                    out = model(**inputs, output_attentions=True)
                assert len(values) == n_layers
                n = len(t["input_ids"])
                at = 0 if arch.kind == "encoder" else n - 1
                for layer in range(n_layers):
                    maps = st.maps(layer, k)
                    np.testing.assert_allclose(maps, out.attentions[layer][0].numpy(), atol=2e-5)
                    v = values[layer][0] if pick is None else pick(values[layer], model, layer)[0]
                    v = v.detach().reshape(n, kv, head_dim).numpy()
                    group = np.arange(n_heads) // (n_heads // kv)  # query head -> its key/value head
                    expected = np.einsum("hj,jhd->hd", maps[:, at, :], v[:, group, :])
                    np.testing.assert_allclose(
                        vectors[layer][k], expected, atol=2e-5, err_msg=f"{model_type} layer {layer} sequence {k}"
                    )
        finally:
            for h in hooks:
                h.remove()

    with AttentionStore(arch_store(model_type)) as store:
        table = surface_table(store)
        # read one sequence at a time (a byte budget below one map): the same table
        pd.testing.assert_frame_equal(surface_table(store, max_bytes=1), table)
    assert len(table) == n_layers * n_heads
    assert np.isfinite(table[["prev", "self", "entropy"]].to_numpy()).all()


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_embeddings_and_lm_head_rows(model_type, arch_model):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    spec, model, tokenizer, config, _ = arch_model(model_type)
    arch = ARCHITECTURES[model_type]
    assert word_embeddings(model) is model.get_input_embeddings()
    # every listed module exists, except position tables the tiny config switches off (DeBERTa: relative positions only)
    absent = [path for path in arch.embeddings if architecture_module(model, path) is None]
    assert absent == (["embeddings.position_embeddings"] if model_type.startswith("deberta") else [])
    keep = embedding_parameters(model)
    assert dict(model.named_parameters())[keep[0]] is model.get_input_embeddings().weight
    # independently: the word embeddings and every learned absolute position table, by module name
    words = model.get_input_embeddings()
    absolute = re.compile(r"(?:^|\.)(?:position_embeddings|wpe|positions_embed|embed_positions)$")
    expected = [
        f"{n}.weight"
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding) and (m is words or absolute.search(n))
    ]
    assert sorted(keep) == sorted(expected)
    if arch.lm_head is not None:
        auto = AutoModelForMaskedLM if arch.kind == "encoder" else AutoModelForCausalLM
        lm = auto.from_config(config)
        assert word_embeddings(lm) is lm.get_input_embeddings()
        prefix = lm.base_model_prefix + "."
        head = {k for k in lm.state_dict() if not k.startswith(prefix)}
        assert head and all(k.startswith(tuple(h + "." for h in arch.lm_head)) for k in head), head


def test_models_doc_table_matches_architectures():
    """docs/models.md's table is architecture_markdown(): one row per type, one column per capability."""
    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    section = text.split("## Supported model types", 1)[1].split("\n## ", 1)[0]
    table = architecture_markdown()
    assert table in section, (
        "docs/models.md 'Supported model types' differs from ARCHITECTURES; paste the output of\n"
        "PYTHONPATH=scripts python -c 'from headatlas.core.models import architecture_markdown as t; print(t())'"
    )
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(ARCHITECTURES)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    for capability in ("map-free", "fused", "`maps: sample` / `none`", "circuits' weight scores"):
        column = header.index(capability)
        cells = {r.split("`")[1]: r.strip("|").split(" | ")[column].strip() for r in rows}
        assert cells["bert"].startswith("yes") and cells["deberta"].startswith("no: "), (capability, cells)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_fused_equals_replayed(model_type, arch_model, arch_store, arch_records):
    """Every type reduces fused (its attention modules from transformers' _can_record_outputs or the table's
    ``attention``, MPNet) to what a replay of its stored maps gives, and leaves the model's outputs as they were."""
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.batching import model_inputs, no_cache
    from headatlas.core.extract import tokenize_records
    from headatlas.core.reduce import attention_modules, fused_reduce, replay
    from headatlas.pande.reducers import SieveReducer
    from headatlas.position.reducers import PositionReducer

    spec, model, tok, config, _ = arch_model(model_type)
    kind = model_kind(config, spec)
    reducers = lambda: [SurfaceReducer(), SieveReducer(), PositionReducer(2, (0, 1, 4, 16))]  # noqa: E731
    with AttentionStore(arch_store(model_type)) as store:
        replayed = replay(store, reducers(), batch_size=2, records=arch_records)
    tokenized, _ = tokenize_records(
        arch_records, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec)
    )  # as extraction tokenizes
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    arch = ARCHITECTURES[model_type]
    if arch.fused is not None:  # the row's "no": transformers' modules cannot hand over the maps layer by layer
        with pytest.raises(ModelError, match="cannot be reduced fused"):
            attention_modules(model, config.num_hidden_layers, model_type)
        with pytest.raises(ModelError, match=re.escape(arch.fused.why)):
            fused_reduce(model, tokenized, reducers(), 4, kind, arch_records, pad, model_type, path="eager")
        return
    fused = fused_reduce(model, tokenized, reducers(), 4, kind, arch_records, pad, model_type, path="eager")
    for a, b in zip(fused[::2], replayed[::2]):  # surface and position tables
        for col in a.columns:
            if a[col].dtype.kind == "f":
                np.testing.assert_allclose(a[col], b[col], rtol=0, atol=1e-6, equal_nan=True, err_msg=col)
    np.testing.assert_allclose(fused[1]["scores"], replayed[1]["scores"], rtol=1e-6, atol=1e-6, equal_nan=True)
    # the hooks are gone and the model returns what it returned before
    inputs = model_inputs(tokenized[:2], model, pad)
    with torch.inference_mode():
        out = model(**inputs, **no_cache(model))
    assert out.attentions is None and not model._forward_hooks
    # the extraction's passes keep no key/value cache where the forward could (every layer's k and v to the end)
    assert bool(no_cache(model)) == ("use_cache" in inspect.signature(model.forward).parameters)
    assert getattr(out, "cache", None) is None and getattr(out, "past_key_values", None) is None


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_mapfree_equals_replayed(model_type, arch_model, arch_store, arch_records):
    """A type whose row calls it map-free (``mapfree``) gives, without maps, the statistics a replay of its stored
    maps gives (every map-free reducer, within 1e-5); any other type is planned eager by itself, or refused when it
    is not fusable either."""
    from headatlas.clark.reducers import SurfaceReducer
    from headatlas.core.extract import tokenize_records
    from headatlas.core.mapfree import mapfree_support, plan_feed
    from headatlas.core.reduce import fused_reduce, replay
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.pande.reducers import SieveReducer
    from headatlas.position.reducers import PositionReducer

    spec, model, tok, config, _ = arch_model(model_type)
    kind = model_kind(config, spec)
    reducers = lambda: [PositionReducer(2, (0, 1, 4, 16)), DetectorReducer(seed=1), SurfaceReducer(), SieveReducer()]  # noqa: E731
    why = mapfree_support(config, spec.max_length)
    if why is not None and ARCHITECTURES[model_type].fused is not None:  # no path without maps (DeBERTa)
        with pytest.raises(ModelError, match=re.escape(f"not map-free ({why}) and not fusable")):
            plan_feed(model, reducers(), spec.max_length)
        return
    if why is not None:
        assert plan_feed(model, reducers(), spec.max_length) == ("eager", why)
        return
    with AttentionStore(arch_store(model_type)) as store:
        replayed = replay(store, reducers(), batch_size=2, records=arch_records)
    tokenized, _ = tokenize_records(
        arch_records, tok, kind, spec.max_length, "truncate", decoder_bos(tok, config, spec)
    )
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    free = fused_reduce(model, tokenized, reducers(), 4, kind, arch_records, pad, model_type, path="mapfree")
    for col in ("sink", "local", "entropy", "distance"):
        np.testing.assert_allclose(free[0][col], replayed[0][col], rtol=0, atol=1e-5, err_msg=col)
    for key in ("scores", "null"):
        np.testing.assert_allclose(free[1][key], replayed[1][key], rtol=0, atol=1e-5, equal_nan=True, err_msg=key)
    for col in [c for c in free[2].columns if free[2][c].dtype.kind == "f"]:  # Clark's surface statistics
        np.testing.assert_allclose(free[2][col], replayed[2][col], rtol=0, atol=1e-5, equal_nan=True, err_msg=col)
    np.testing.assert_allclose(free[3]["scores"], replayed[3]["scores"], rtol=0, atol=1e-5, equal_nan=True)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_weight_layout_rows(model_type, arch_model):
    """A row's weight layout gives the circuits every head's folded weights, each head's W_V W_O acting as its
    slice of the value and output projections; a row without one skips the scores with its reason."""
    from headatlas.circuits.weights import UnsupportedModel, head_weights

    spec, model, tok, config, _ = arch_model(model_type)
    layout = ARCHITECTURES[model_type].weight_layout
    if isinstance(layout, No):
        with pytest.raises(UnsupportedModel, match=re.escape(layout.why)):
            head_weights(model)
        return
    hw = head_weights(model)
    n_layers, n_heads, d_model, d_head = hw.shape
    assert (n_layers, n_heads, d_model) == (config.num_hidden_layers, config.num_attention_heads, config.hidden_size)
    assert hw.layout == layout and np.isfinite(hw.q).all() and np.isfinite(hw.o).all()
    assert hw.o.shape == (n_layers, n_heads, d_head, d_model) and hw.v.shape == hw.q.shape


def _toy_row(**capabilities):
    """A new model type's row: Llama's parts, every capability unless ``capabilities`` says otherwise."""
    return dataclasses.replace(ARCHITECTURES["llama"], **{"mapfree": None, "fused": None, **capabilities})


def test_a_new_model_type_is_one_architecture_row(monkeypatch, tiny_loaded):
    """A throwaway model type ``toy`` (the tiny Llama under another name) added to the table alone gets its
    capabilities read by the map-free planner, the fused path, the circuits' weight scores, the config check and
    the generated docs table."""
    from headatlas.circuits.weights import UnsupportedModel, head_weights
    from headatlas.core.config_checks import check_without_maps
    from headatlas.core.mapfree import mapfree_support, plan_feed
    from headatlas.position.reducers import PositionReducer

    model = tiny_loaded("llama")[1]
    config = model.config
    monkeypatch.setattr(config, "model_type", "toy")  # the loaded model now reports the new type
    reducers = [PositionReducer(2, (0, 1))]
    settings = {"extraction": {"attention": "auto"}, "corpora": {"c": {"maps": "sample"}}}

    monkeypatch.setitem(ARCHITECTURES, "toy", _toy_row(weight_layout="llama"))  # every capability
    assert mapfree_support(config) is None and plan_feed(model, reducers, 16)[0] == "mapfree"
    assert plan_feed(model, reducers, 16, "eager") == ("eager", "asked for")
    assert head_weights(model).layout == "llama"
    check_without_maps(settings, {"m": {}}, "m", "toy")
    assert "| `toy` | decoder |" in architecture_markdown()

    no_free, no_fused = No("toy scores"), No("toy modules")
    monkeypatch.setitem(ARCHITECTURES, "toy", _toy_row(weight_layout=No("toy layout"), mapfree=no_free))
    assert mapfree_support(config) == "toy scores" and plan_feed(model, reducers, 16) == ("eager", "toy scores")
    with pytest.raises(UnsupportedModel, match="'toy': toy layout"):
        head_weights(model)
    row = next(r for r in architecture_markdown().splitlines() if r.startswith("| `toy` |"))
    assert row.endswith("| no: toy scores | yes | yes, fused | no: toy layout |"), row

    monkeypatch.setitem(ARCHITECTURES, "toy", _toy_row(weight_layout="llama", mapfree=no_free, fused=no_fused))
    with pytest.raises(ModelError, match=r"not map-free \(toy scores\) and not fusable \(toy modules\)"):
        plan_feed(model, reducers, 16)
    with pytest.raises(ModelError, match=r"corpora\.c\.maps: sample on model 'm' \(model type 'toy'\)"):
        check_without_maps(settings, {"m": {}}, "m", "toy")
    assert "| no: toy scores | no: toy modules | no: keep `maps: full` | yes, llama layout |" in architecture_markdown()

    monkeypatch.setitem(ARCHITECTURES, "toy", _toy_row(weight_layout="llama", fused=no_fused))
    assert plan_feed(model, reducers, 16)[0] == "mapfree"
    with pytest.raises(ModelError, match=r"not fusable \(toy modules\); set maps: full .* or extraction.attention"):
        check_without_maps(dict(settings, extraction={"attention": "eager"}), {"m": {}}, "m", "toy")


@pytest.mark.parametrize("model_type", ["deberta", "deberta-v2"])
def test_deberta_sample_corpus_fails_clearly(model_type, arch_model, arch_records, tmp_path):
    """DeBERTa is neither map-free nor fusable: a maps: sample corpus stops at parse time where its config.json is
    readable, else at its extraction naming both reasons, and leaves no store behind."""
    from headatlas.core.config_checks import check_models
    from headatlas.core.extract import extract

    spec, model, tok, config, d = arch_model(model_type)
    out = tmp_path / "store"
    with pytest.raises(ModelError, match=r"not map-free \(disentangled .*\) and not fusable \(declares no"):
        extract(
            arch_records, spec, model, tok, config, out, ExtractSettings(overflow="truncate", maps=False),
            meta={"corpus": "t"}, reducers=[], sample=[0, 1],
        )  # fmt: skip
    assert not out.exists() and not list(tmp_path.iterdir())
    cfg = {
        "extraction": {"rep_position": "last", "attention": "auto"},
        "corpora": {"ewt": {"maps": "full"}, "wiki": {"maps": "sample", "sample": 4}},
    }
    models = {"deb": {"name": "deb", "source": {"path": str(d)}, "max_length": 64}}
    with pytest.raises(ModelError, match=r"config key corpora\.wiki\.maps: sample on model 'deb'.*set maps: full"):
        check_models(cfg, models)
    cfg["corpora"]["wiki"]["maps"] = "full"
    del cfg["corpora"]["wiki"]["sample"]
    assert check_models(cfg, models) == []
