"""Function-vector heads: tasks and prompts, last-position patching (batched = one at a time = a plain hook),
a hand-built model whose answer one head carries, attribution patching checked against exact values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headatlas.icl.analysis import IclSettings, fv_heads
from headatlas.icl.patching import TaskMeans, equal_length_batches, fv_evaluation
from headatlas.icl.tasks import TaskError, build_prompts, ewt_pairs, file_pairs, prompt_text, single_token_pairs

# --- tasks and prompts ------------------------------------------------------------------------


class WordTokenizer:
    """One token per space-led word or symbol: ids from a growing table (a stand-in with exact splits)."""

    def __init__(self, multi=()):
        self.table: dict[str, int] = {}
        self.multi = set(multi)  # words that take two tokens

    def __call__(self, text, add_special_tokens=False):
        import re

        ids = []
        for piece in re.findall(r" ?[A-Za-z]+|\n\n|\n|:", text):
            parts = [piece[:2], piece[2:]] if piece.strip() in self.multi else [piece]
            ids += [self.table.setdefault(p, len(self.table)) for p in parts]
        return {"input_ids": ids}


def test_prompt_template_is_todds():
    assert prompt_text([("a", "b"), ("c", "d")], "e") == "Q: a\nA: b\n\nQ: c\nA: d\n\nQ: e\nA:"


def test_prompts_shuffle_labels_only_and_keep_the_query_target():
    tok = WordTokenizer()
    pairs = [(f"w{c}", f"W{c}") for c in "abcdefghijklmnop"]
    usable = single_token_pairs(pairs, tok)
    clean = build_prompts("t", usable, 5, 10, tok, 99, np.random.default_rng(0), shuffled=False)
    bad = build_prompts("t", usable, 5, 10, tok, 99, np.random.default_rng(0), shuffled=True)
    inv = {v: k for k, v in tok.table.items()}

    def label(x):  # the true label's id
        return tok(" W" + inv[x].strip()[1:])["input_ids"][0]

    moved = 0
    for ids, shuffled in [(a, False) for a in clean.ids] + [(b, True) for b in bad.ids]:
        assert ids[0] == 99 and len(ids) == 1 + 10 * 8 + 6  # BOS, 10 x (Q : x \n A : y \n\n), Q : x \n A :
        xs, ys = [ids[1 + 8 * i + 2] for i in range(10)], [ids[1 + 8 * i + 6] for i in range(10)]
        assert sorted(ys) == sorted(label(x) for x in xs)  # the demonstrations' own labels
        moved += sum(y != label(x) for x, y in zip(xs, ys))
        assert shuffled or moved == 0
    assert moved > 20  # permuted: most labels moved
    assert [label(ids[-4]) for ids in bad.ids] == list(bad.target)  # the query keeps its true target
    with pytest.raises(TaskError, match="needs 11"):
        build_prompts("t", usable[:10], 1, 10, tok, None, np.random.default_rng(0), shuffled=False)


def test_single_token_filter():
    tok = WordTokenizer(multi={"long"})
    got = single_token_pairs([("a", "b"), ("long", "c"), ("d", "long")], tok)
    assert [(x, y) for x, y, _, _ in got] == [("a", "b")]
    assert got[0][2] == tok(" a")["input_ids"][0]


def test_ewt_pairs_from_features(tmp_path):
    rows = [
        ("walked", "walk", "VERB", "Mood=Ind|Tense=Past|VerbForm=Fin"),
        ("walked", "walk", "VERB", "Mood=Ind|Tense=Past|VerbForm=Fin"),
        ("walk", "walk", "VERB", "Mood=Ind|Tense=Pres|VerbForm=Fin"),
        ("dogs", "dog", "NOUN", "Number=Plur"),
        ("bigger", "big", "ADJ", "Degree=Cmp"),
        ("Cats", "cat", "NOUN", "Number=Plur"),  # sentence-initial capital: lowercased
        ("put", "put", "VERB", "Mood=Ind|Tense=Past|VerbForm=Fin"),  # form = lemma: left out
    ]
    lines = ["# sent_id = 1"] + [f"{i}\t{f}\t{lem}\t{u}\t_\t{ft}\t0\troot\t_\t_" if i == 1 else
                                 f"{i}\t{f}\t{lem}\t{u}\t_\t{ft}\t1\tdep\t_\t_" for i, (f, lem, u, ft) in
                                 enumerate(rows, 1)]  # fmt: skip
    path = tmp_path / "x.conllu"
    path.write_text("\n".join(lines) + "\n\n")
    p = ewt_pairs([path])
    assert p["past_tense"] == [("walk", "walked")]
    assert p["plural"] == [("cat", "cats"), ("dog", "dogs")] and p["singular"] == [("cats", "cat"), ("dogs", "dog")]
    assert p["comparative"] == [("big", "bigger")] and p["superlative"] == []
    assert ("walk", "Walk") in p["capitalise"] and ("dog", "d") in p["first_letter"]


def test_file_pairs_errors_name_the_line(tmp_path):
    good = tmp_path / "a.tsv"
    good.write_text("# comment\ninput\toutput\nhot\tcold\n")
    assert file_pairs(good) == [("hot", "cold")]
    bad = tmp_path / "b.tsv"
    bad.write_text("input\toutput\nhot\tcold\nwarm\n")
    with pytest.raises(TaskError, match=r"b\.tsv:3"):
        file_pairs(bad)
    no_header = tmp_path / "c.tsv"
    no_header.write_text("hot\tcold\n")
    with pytest.raises(TaskError, match="header"):
        file_pairs(no_header)


def test_equal_length_batches():
    b = equal_length_batches([[1, 2], [1], [3, 4], [5], [6, 7]], 2)
    assert [list(x) for x in b] == [[1, 3], [0, 2], [4]]


# --- patching on a tiny random Llama ------------------------------------------------------------

SMALL = IclSettings(n_prompts=6, bootstrap=200, check_heads=2)


@pytest.fixture(scope="module")
def tiny_llama():
    import torch
    from conftest import tiny_llama_config
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(40, 0, pad_token_id=None))
    model.eval()
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(1, 40, size=n)) for n in (9, 12, 9, 12, 9)]  # two lengths: three batches
    targets = rng.integers(1, 40, size=len(prompts))
    means = rng.normal(size=(2, 2, 4, 8)).astype(np.float32)  # 2 tasks, 2 layers x 4 heads, d = 8
    task_of = np.array([0, 1, 1, 0, 1])
    return model, prompts, targets, means, task_of


def test_batched_exact_equals_one_at_a_time_and_a_plain_hook(tiny_llama):
    """The batched exact patch (expanded inside the model, replicated inputs, one head per pass), the
    patch of one head at a time and Todd et al.'s hook give the same indirect effects."""
    from reference.icl import indirect_effects

    from headatlas.core.extract import head_output_modules

    model, prompts, targets, means, task_of = tiny_llama
    ev = fv_evaluation(model, prompts, targets, 2, 2, 4)
    assert ev.expand and len(ev.batches) == 3
    values = TaskMeans(means, task_of)
    corrupted = ev.run()["loss"]
    ref = indirect_effects(model, head_output_modules(model, 2), prompts, targets, means, task_of, 4)
    assert np.abs(ref).max() > 1e-3  # the patch moves p(target)
    for max_rows in (10**6, 1):
        got = ev.exact(range(8), values, max_rows)["loss"] - corrupted[:, None]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    one = np.stack([ev.run(np.eye(8, dtype=bool)[f].reshape(2, 4), values)["loss"] for f in range(8)], 1)
    np.testing.assert_allclose(one - corrupted[:, None], ref, rtol=1e-4, atol=1e-6)
    ev.expand = False
    np.testing.assert_allclose(ev.exact(range(8), values)["loss"] - corrupted[:, None], ref, rtol=1e-4, atol=1e-6)


def test_attribution_patching_is_the_first_order_term(tiny_llama):
    """AtP equals the directional derivative of p(target) towards the mean (finite differences on a
    small step) and agrees with exact patching to first order on a small replacement."""
    model, prompts, targets, means, task_of = tiny_llama
    ev = fv_evaluation(model, prompts, targets, 4, 2, 4)
    z = ev.last_outputs()  # [S, L, H, d]
    corrupted = ev.run()["loss"]
    eps = 1e-3
    est = ev.estimate(TaskMeans(means, task_of))
    step = z + eps * (means[task_of] - z)  # per prompt: a small step from its own output towards its task mean
    got = ev.exact(range(8), TaskMeans(step, np.arange(len(prompts))))["loss"] - corrupted[:, None]
    np.testing.assert_allclose(got / eps, est, rtol=2e-2, atol=1e-4)


# --- a hand-built model: one head carries the task ----------------------------------------------

K = 12  # inputs 0..K-1, outputs K..2K-1, the task x -> x + K


def _carrier(scale: float = 5.0):
    """A one-layer 'llama'-named model with 3 heads of width 1. Head 0's output at position t is the share of
    the 10 demonstrations seen so far whose label is the task's (token t = token t-1 + K), head 1's is 0,
    head 2's varies with the token but its output projection is zero. The logits at t are
    ``scale * h0 * [v = token t + K]``: only head 0 carries the answer."""
    import torch
    from hand_models import one_layer_llama

    def outputs(ids):
        match = torch.zeros_like(ids, dtype=torch.float32)
        match[:, 1:] = (ids[:, 1:] == ids[:, :-1] + K).float()
        return torch.stack([match.cumsum(1) / 10, torch.zeros_like(match), ids.float() / K], -1)

    def logits(h, ids):
        return scale * h[..., :1] * torch.nn.functional.one_hot(ids + K, 3 * K).float()

    return one_layer_llama(3, outputs, logits, o_diag=[1.0, 1.0, 0.0])


def _carrier_prompts(rng, n, shuffled):
    ids, target = [], []
    for _ in range(n):
        x = rng.choice(K, 11, replace=False)
        y = x[:10] + K
        if shuffled:
            y = y[rng.permutation(10)]
        ids.append([int(t) for pair in zip(x[:10], y) for t in pair] + [int(x[10])])
        target.append(int(x[10]) + K)
    return ids, np.array(target)


def test_a_head_that_carries_the_task_gets_the_largest_aie_and_a_zero_head_none():
    """Head 0 patched with its clean mean restores the clean p(target) exactly: its AIE is the largest any
    patch can give (mean clean - corrupted p); heads 1 (zero output) and 2 (zero projection) get exactly 0."""
    model = _carrier()
    rng = np.random.default_rng(0)
    clean = fv_evaluation(model, *_carrier_prompts(rng, 8, False), 4, 1, 3)
    ids, target = _carrier_prompts(rng, 40, True)
    bad = fv_evaluation(model, ids, target, 8, 1, 3)
    z = clean.last_outputs()
    np.testing.assert_allclose(z[:, 0, 0, 0], 1.0)  # every clean prompt: 10 of 10 labels right
    bad.values = TaskMeans(z.mean(0, keepdims=True), np.zeros(40, int))
    p_clean, p_bad = clean.run()["loss"].mean(), bad.run()["loss"]
    heads, check = fv_heads("carrier", bad, SMALL, ["x+K"])
    assert (heads["kind"] == "exact").all()
    np.testing.assert_allclose(heads["aie"].iloc[0], p_clean - p_bad.mean(), rtol=1e-6)
    assert heads["aie"].iloc[0] > 0.3 and heads["ci_low"].iloc[0] > 0
    assert heads["aie"].iloc[1] == 0 and heads["aie"].iloc[2] == 0 and heads["ci_high"].iloc[1] == 0
    assert list(heads["rank"])[0] == 1 and heads["top"].iloc[0]
    # the null: head 0 patched with another head's mean loses the answer, the others stay at 0
    assert heads["null_aie"].iloc[0] < 0 and (heads["null_aie"].iloc[1:] == 0).all()
    assert heads["null_quantile"].iloc[0] == 1.0 and heads["above_null"].iloc[0]
    assert set(check["replacement"]) == {"task mean", "null"}


# --- tables ------------------------------------------------------------------------------------


def _fv_table(aie, kinds=None):
    n = len(aie)
    layer, head = np.divmod(np.arange(n), 4)
    return pd.DataFrame({"model": "m", "layer": layer, "head": head, "aie": aie, "ci_low": np.asarray(aie) - 0.1,
                         "ci_high": np.asarray(aie) + 0.1, "null_quantile": 0.5, "above_null": True, "top": False,
                         "kind": kinds or ["exact"] * n})  # fmt: skip


def test_agreement_table_ranks_and_top_k():
    from headatlas.icl.analysis import agreement_table

    aie = np.arange(12, dtype=float)
    heads = _fv_table(aie, ["exact"] * 11 + ["unreliable"])  # the unreliable head is left out
    atlas = pd.DataFrame({"layer": heads["layer"], "head": heads["head"], "det_induction": aie,
                          "det_prev": -aie})  # fmt: skip
    t = agreement_table(heads, atlas, 3, 200, 0).set_index("score")
    assert list(t.index) == ["det_induction", "det_prev"]  # only the scores the atlas has
    assert t.loc["det_induction", "spearman"] == pytest.approx(1.0) and t.loc["det_prev", "spearman"] == -1
    assert t.loc["det_induction", "n_heads"] == 11 and t.loc["det_induction", "top_k_overlap"] == 3
    assert t.loc["det_induction", "shared_top_heads"] == "3-1,3-2,3-3"  # flat 8, 9, 10 (1-based labels)
    assert t.loc["det_prev", "top_k_overlap"] == 0 and t.loc["det_prev", "shared_top_heads"] == ""


def test_atlas_columns_hide_unreliable_values():
    from headatlas.atlas.analysis import icl_columns
    from headatlas.atlas.columns import describe

    out = icl_columns(_fv_table([0.2, 0.1], ["exact", "unreliable"]))
    assert out["icl_aie"].iloc[0] == 0.2 and np.isnan(out["icl_aie"].iloc[1])
    assert np.isnan(out["icl_aie_ci_low"].iloc[1]) and out["icl_aie_kind"].iloc[1] == "unreliable"
    assert all(describe(c).known and describe(c).family.startswith("ICL") for c in out.columns[2:])


def test_figure_with_and_without_induction_scores(tmp_path):
    from headatlas.icl.figures import fv_figure

    heads = _fv_table(np.linspace(-0.1, 0.3, 8), ["exact"] * 7 + ["unreliable"])
    heads["top"] = heads["aie"] > 0.2
    det = pd.DataFrame({"layer": heads["layer"], "head": heads["head"], "detector": "induction", "main": True,
                        "mean": np.linspace(0, 1, 8)})  # fmt: skip
    for name, d in (("with", det), ("without", None)):
        fv_figure(heads, d, "m", tmp_path / f"{name}.png", tmp_path / f"{name}.svg")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000 and (tmp_path / f"{name}.svg").exists()
    skipped = heads.assign(aie=np.nan, kind="skipped: an encoder")
    fv_figure(skipped, None, "m", tmp_path / "s.png", tmp_path / "s.svg")
    assert "skipped" in (tmp_path / "s.svg").read_text()
