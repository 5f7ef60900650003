"""Clark et al. surface statistics, behaviour labels, best heads and figures on hand-built maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from reference.surface import row_entropy, sequence_stats

from headatlas.clark.surface import (
    STATS,
    behaviour_labels,
    behaviour_table,
    best_heads,
    clark_headlines,
    example_index,
    relative_layers,
)
from headatlas.core.data import SPECIAL_BOS, SPECIAL_CLS, SPECIAL_NONE, SPECIAL_SEP

COL = {s: i for i, s in enumerate(STATS)}


def next_head(n: int) -> np.ndarray:
    """One-hot next-token head; the last row attends to itself."""
    a = np.zeros((n, n))
    a[np.arange(n - 1), np.arange(1, n)] = 1.0
    a[n - 1, n - 1] = 1.0
    return a


def prev_head(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    a[np.arange(1, n), np.arange(n - 1)] = 1.0
    a[0, 0] = 1.0
    return a


def causal_uniform(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def encoder_tokens(n: int):
    """[CLS] w . w , [SEP] w ... [SEP]: kinds and pieces of an n-token pair."""
    special = np.full(n, SPECIAL_NONE)
    special[0] = SPECIAL_CLS
    special[n // 2] = SPECIAL_SEP
    special[-1] = SPECIAL_SEP
    piece = np.array(["w"] * n, dtype=object)
    piece[0], piece[n // 2], piece[-1] = "[CLS]", "[SEP]", "[SEP]"
    piece[2], piece[3] = ".", ","
    return special, piece


def test_next_head_scores_n_minus_one_over_n():
    n = 10
    special, piece = encoder_tokens(n)
    s = sequence_stats(next_head(n)[None], special, piece, causal=False, smoothing=1e-4)[0]
    assert s[COL["next"]] == pytest.approx((n - 1) / n)
    assert s[COL["prev"]] == 0.0
    assert s[COL["self"]] == pytest.approx(1 / n)


def test_prev_head_and_directions_are_not_swapped():
    n = 8
    special, piece = encoder_tokens(n)
    s = sequence_stats(prev_head(n)[None], special, piece, causal=False, smoothing=1e-4)[0]
    assert s[COL["prev"]] == pytest.approx((n - 1) / n)
    assert s[COL["next"]] == 0.0


def test_uniform_head_special_shares_and_entropy():
    n = 8
    special, piece = encoder_tokens(n)
    s = sequence_stats(np.full((1, n, n), 1 / n), special, piece, causal=False, smoothing=1e-4)[0]
    assert s[COL["cls"]] == pytest.approx(1 / n)
    assert s[COL["sep"]] == pytest.approx(2 / n)  # both [SEP]s count
    assert s[COL["punct"]] == pytest.approx(2 / n)
    assert s[COL["sep_to_sep"]] == pytest.approx(2 / n)
    assert s[COL["other_to_sep"]] == pytest.approx(2 / n)
    assert s[COL["entropy"]] == pytest.approx(np.log(n))
    assert s[COL["entropy_uniform"]] == pytest.approx(np.log(n))
    assert s[COL["cls_entropy"]] == pytest.approx(np.log(n))


def test_sep_to_sep_against_other_to_sep():
    n = 6
    special, piece = encoder_tokens(n)
    a = np.zeros((n, n))
    sep = np.flatnonzero(special == SPECIAL_SEP)
    a[:, 0] = 1.0  # everyone attends to [CLS] ...
    a[sep, 0] = 0.0
    a[sep[0], sep[1]] = 1.0  # ... except the [SEP]s, which attend to each other
    a[sep[1], sep[0]] = 1.0
    s = sequence_stats(a[None], special, piece, causal=False, smoothing=0.0)[0]
    assert s[COL["sep_to_sep"]] == pytest.approx(1.0)
    assert s[COL["other_to_sep"]] == pytest.approx(0.0)
    assert s[COL["cls"]] == pytest.approx((n - 2) / n)


def test_one_hot_rows_have_entropy_near_zero_and_smoothing_is_clark():
    n, eps = 5, 1e-4
    ent = row_entropy(next_head(n)[None], causal=False, smoothing=eps)[0]
    big, small = 1 - eps + eps / n, eps / n
    expected = -(big * np.log(big) + (n - 1) * small * np.log(small))
    np.testing.assert_allclose(ent, expected)


def test_decoder_bos_plays_cls_and_mask_is_respected():
    n = 6
    special = np.full(n, SPECIAL_NONE)
    special[0] = SPECIAL_BOS
    piece = np.array(["<bos>"] + ["w"] * (n - 1), dtype=object)
    s = sequence_stats(causal_uniform(n)[None], special, piece, causal=True, smoothing=1e-4)[0]
    k = np.arange(1, n + 1)
    assert s[COL["cls"]] == pytest.approx(np.mean(1 / k))  # row i gives 1/(i+1) to BOS
    assert np.isnan(s[COL["next"]])  # the causal mask hides the next token
    for col in ("sep", "sep_to_sep", "other_to_sep"):
        assert np.isnan(s[COL[col]])
    # uniform over the allowed keys: entropy = mean ln(i+1), exactly the causal uniform reference
    assert s[COL["entropy"]] == pytest.approx(np.mean(np.log(k)))
    assert s[COL["entropy_uniform"]] == pytest.approx(np.mean(np.log(k)))
    assert s[COL["cls_entropy"]] == pytest.approx(np.log(n))  # the last token's row


def test_decoder_without_bos_has_no_cls_share():
    n = 4
    s = sequence_stats(causal_uniform(n)[None], np.zeros(n, int), np.array(["w"] * n), causal=True, smoothing=1e-4)[0]
    assert np.isnan(s[COL["cls"]])


def heads_table(rows, kind="encoder"):
    base = {s: 0.0 for s in STATS}
    base.update(entropy=1.0, model="m", model_kind=kind)
    out = []
    for i, r in enumerate(rows):
        out.append(dict(base, layer=i // 4, head=i % 4, **r))
    return pd.DataFrame(out)


def test_behaviour_labels_thresholds_and_override_order():
    t = heads_table(
        [
            {"next": 0.51},
            {"prev": 0.9},
            {"entropy": 3.9},
            {"cls": 0.61},
            {"sep": 0.7},
            {"punct": 0.65},
            {"next": 0.5, "cls": 0.6},  # thresholds are strict: 'other'
            {"prev": 0.8, "sep": 0.61},  # sep overrides prev
            {"entropy": 4.0, "punct": 0.61},  # punct overrides broad
            {"next": 0.7, "entropy": 3.81},  # broad overrides next
            {"sep": np.nan, "entropy": 1.0},
        ]
    )
    assert behaviour_labels(t).tolist() == [
        "next",
        "prev",
        "broad",
        "cls",
        "sep",
        "punct",
        "other",
        "sep",
        "punct",
        "broad",
        "other",
    ]


def test_decoder_label_is_bos():
    t = heads_table([{"cls": 0.9}], kind="decoder")
    assert behaviour_labels(t).tolist() == ["bos"]


def test_best_heads_skip_undefined_statistics():
    t = heads_table([{"prev": 0.2}, {"prev": 0.7, "cls": 0.3}, {"cls": 0.8, "entropy": 4.2}], kind="decoder")
    t["next"] = np.nan
    t["sep"] = np.nan
    best = best_heads(t).set_index("behaviour")
    assert "next" not in best.index and "sep" not in best.index
    assert (best.loc["prev", "layer"], best.loc["prev", "head"]) == (0, 1)
    assert best.loc["bos", "head"] == 2
    assert best.loc["broad", "score"] == pytest.approx(4.2)


def test_example_index_and_labels():
    assert example_index(np.array([50, 23, 26, 24, 24]), 24) == 3


def test_relative_layers_match_bert_base():
    np.testing.assert_array_equal(relative_layers(12, 6, 10), np.arange(5, 10))
    np.testing.assert_array_equal(relative_layers(6, 6, 10), [2, 3, 4])
    np.testing.assert_array_equal(relative_layers(30, 1, 4), np.arange(10))
    np.testing.assert_array_equal(relative_layers(30, 9, 12), np.arange(20, 30))
    assert len(relative_layers(1, 1, 4)) == 1


def test_headlines_flag_middle_layer_sep_share():
    rows = [{"sep": 0.8 if 5 <= i // 12 <= 9 else 0.05, "self": 0.02, "sep_to_sep": 0.95} for i in range(144)]
    t = pd.DataFrame(
        [
            dict({s: 0.0 for s in STATS}, **r, layer=i // 12, head=i % 12, model="m", model_kind="encoder")
            for i, r in enumerate(rows)
        ]
    )
    h = clark_headlines(t, {"within_layer": 0.1, "between_layer": 0.2, "ratio": 2.0, "p_value": 0.001}).set_index(
        "claim"
    )
    assert h.loc["over half of the attention in middle layers goes to [SEP]", "holds"] == "yes"
    assert h.loc["over half of the attention in middle layers goes to [SEP]", "measured"] == pytest.approx(0.8)
    assert h.loc["[SEP]-attending heads send > 90% of [SEP]'s attention to [SEP]s", "holds"] == "yes"
    assert h.loc["heads in the same layer cluster together", "holds"] == "yes"
    assert h.loc["from layer 5 on, gradients for attention to [SEP] are small", "holds"] == "not applicable"


def test_headlines_skip_the_bos_gradient_claim_for_a_decoder_without_bos():
    """Qwen2 gets no BOS token: its gradients have no sep_bos key type, and the claim is skipped, not a KeyError."""
    t = pd.DataFrame(
        [dict({s: 0.1 for s in STATS}, layer=i // 4, head=i % 4, model="m", model_kind="decoder") for i in range(24)]
    )
    grads = pd.DataFrame(
        [
            {"layer": layer, "key_type": kt, "mean_abs_grad": 1.0, "status": "ok"}
            for layer in range(6)
            for kt in ("other", "punct")
        ]
    )
    h = clark_headlines(t, None, grads).set_index("claim")
    row = h.loc["from layer 5 on, gradients for attention to BOS are small"]
    assert row["holds"] == "not applicable" and "no BOS token" in row["measure"]


def test_surface_figures_render(tmp_path):
    from headatlas.clark.figures import fig2_surface, fig4_entropy
    from headatlas.core.figures import save_figure

    rng = np.random.default_rng(0)
    t = pd.DataFrame(
        [
            dict(
                {s: rng.random() for s in STATS},
                layer=i // 4,
                head=i % 4,
                model="m",
                model_kind="decoder",
                n_sequences=3,
            )
            for i in range(12)
        ]
    )
    t["next"] = np.nan
    t["sep"] = np.nan
    save_figure(fig2_surface(t, "m", "wiki"), tmp_path / "f2.png", tmp_path / "f2.svg")
    save_figure(fig4_entropy(t, "m", "wiki"), tmp_path / "f4.png", tmp_path / "f4.svg")
    assert (
        (tmp_path / "f2.png").stat().st_size > 1000
        and (tmp_path / "f2.svg").is_file()
        and (tmp_path / "f4.png").is_file()
    )


# --- the Clark surface / gradient / clustering / example DAG end to end -------------------------------

CLARK_FILES = [
    "surface.tsv",
    "behaviour.tsv",
    "fig2_surface.png",
    "fig2_surface.svg",
    "fig4_entropy.png",
    "gradients.tsv",
    "fig3_gradients.png",
    "js_distance.tsv",
    "mds.tsv",
    "layer_clustering.tsv",
    "fig6_mds.png",
    "examples.tsv",
    "fig1_examples.png",
    "headlines.tsv",
]


@pytest.mark.slow
def test_clark_surface_dag_end_to_end(tmp_path, bert_vocab_file):
    """A tiny BERT with its masked-LM head through every rule of clark_surface.smk."""
    import torch
    from conftest import WIKI_TEST, output_of, run_snakemake
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    model_dir = tmp_path / "bert_mlm"
    wp = BertTokenizerFast(vocab=str(bert_vocab_file), do_lower_case=True)
    torch.manual_seed(0)
    BertForMaskedLM(
        BertConfig(
            vocab_size=len(wp),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=128,
        )
    ).save_pretrained(model_dir)
    wp.save_pretrained(model_dir)
    cfg = {
        "models": [{"name": "bert", "source": {"path": str(model_dir)}, "max_length": 64, "batch_size": 4}],
        "corpora": {
            "wiki": {
                "kind": "wikitext",
                "path": str(WIKI_TEST),
                "n_segments": 6,
                "max_words": 40,
                "seed": 0,
                "overflow": "truncate",
            }
        },
        "analysis": {
            "clark_surface": {
                "corpora": ["wiki"],
                "gradients": {"n_segments": 3},
                "clustering": {"n_segments": 4, "permutations": 50, "mds_n_init": 1, "mds_max_iter": 100},
                "examples": {"n_tokens": 12},
            }
        },
    }
    work = tmp_path / "work"
    work.mkdir()
    targets = [f"results/clark/bert/wiki/{f}" for f in CLARK_FILES]
    proc = run_snakemake(work, cfg, *targets, timeout=600)
    assert proc.returncode == 0, output_of(proc)[-6000:]
    out = work / "results" / "clark" / "bert" / "wiki"
    behaviour = pd.read_csv(out / "behaviour.tsv", sep="\t")
    assert len(behaviour) == 8 and set(behaviour["label"]) <= {"next", "prev", "broad", "cls", "sep", "punct", "other"}
    grads = pd.read_csv(out / "gradients.tsv", sep="\t")
    assert set(grads["status"]) == {"ok"} and set(grads["loss_kind"]) == {"masked_lm"}
    assert set(grads["key_type"]) >= {"sep_bos", "cls", "other"} and (grads["mean_abs_grad"] > 0).all()
    js = pd.read_csv(out / "js_distance.tsv", sep="\t")
    assert (
        len(js) == 8 * 9 // 2 and (js.loc[(js.layer_a == js.layer_b) & (js.head_a == js.head_b), "js_sum"] == 0).all()
    )
    mds = pd.read_csv(out / "mds.tsv", sep="\t")
    assert list(mds.columns[:4]) == ["model", "layer", "head", "label"] and mds[["mds_x", "mds_y"]].notna().all().all()
    headlines = pd.read_csv(out / "headlines.tsv", sep="\t")
    assert set(headlines["holds"]) <= {"yes", "no", "not applicable"} and len(headlines) >= 10
    for f in CLARK_FILES:
        assert (out / f).stat().st_size > 0, f
    assert not [p for p in (work / "results").rglob("*") if ".tmp" in p.name]


def test_surface_settings_from_config():
    from headatlas.clark.surface import ClusteringSettings, SurfaceSettings

    s = SurfaceSettings.pick({"broad_entropy": 2.0, "clustering": {"seed": 3, "mds_eps": 1e-6}, "activate": True})
    assert s.broad_entropy == 2.0 and s.smoothing == SurfaceSettings().smoothing
    assert s.clustering == ClusteringSettings(seed=3, mds_eps=1e-6)
    assert SurfaceSettings.pick({"gradients": {"n_segments": 5, "threads": 4}}).gradients.n_segments == 5
    with pytest.raises(ValueError, match=r"analysis\.clark_surface\.gradients\.threads: unknown setting"):
        SurfaceSettings.from_config({"gradients": {"n_segments": 5, "threads": 4}})  # threads goes to the rule
    assert SurfaceSettings.from_config({}) == SurfaceSettings()
    with pytest.raises(TypeError):
        SurfaceSettings(1e-4)  # keyword-only
    # the behaviour rule's thresholds reach behaviour_labels
    t = heads_table([{"entropy": 3.0}, {"entropy": 4.0}])
    assert behaviour_table(t, SurfaceSettings.from_config({"broad_entropy": 2.5}))["label"].tolist() == ["broad"] * 2
    assert behaviour_table(t)["label"].tolist() == ["other", "broad"]


def test_example_heads_on_a_stored_sequence(tmp_path):
    from headatlas.clark.figures import example_heads, examples_figure
    from headatlas.clark.surface import ExampleSettings
    from headatlas.core.data import TokenizedRecord
    from headatlas.core.store import AttentionStore, AttentionWriter

    rng = np.random.default_rng(0)
    toks, blocks = [], {}
    for i, (n, punct) in enumerate(((6, True), (8, False), (8, True), (9, True))):
        special, piece = encoder_tokens(n)
        if not punct:
            piece[2] = piece[3] = "w"
        piece[1] = "\u0120cat"  # byte-level BPE: a space mark, dropped when displayed
        toks.append(TokenizedRecord(i, tuple(range(n)), tuple(piece), tuple(range(n)), tuple(special), (0,) * n, n))
    with AttentionWriter(tmp_path / "s", toks, ["a", "b", "c", "d"], 1, 4, meta={"model": "m"}) as w:
        for k, t in enumerate(toks):
            a = rng.random((4, len(t), len(t))).astype(np.float32)
            blocks[k] = a / a.sum(-1, keepdims=True)
            w.write(k, 0, blocks[k])
    behaviour = heads_table([{"prev": 0.9}, {"next": 0.8}, {"cls": 0.7}, {"entropy": 4.0}])
    with AttentionStore(tmp_path / "s") as store:
        table, maps, tokens = example_heads(store, behaviour, ExampleSettings(n_tokens=8))
        fig_table, fig = examples_figure(store, behaviour, "m", "wiki", ExampleSettings(n_tokens=8))
    # length 8 with a period or comma: the third sequence (the second has none)
    assert set(table["sequence"]) == {2} and set(table["record_id"]) == {"c"} and set(table["n_tokens"]) == {8}
    assert (table.set_index("behaviour").loc["prev", ["layer", "head"]] == [0, 0]).all()
    assert np.allclose(maps[(0, 3)], blocks[2][3], atol=1e-3)
    assert tokens[:3] == ["[CLS]", "cat", "."] and len(tokens) == 8
    assert fig_table.equals(table)
    fig.clf()
