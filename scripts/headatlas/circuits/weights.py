"""Scores read off the weights (no data): Q-, K- and V-composition between heads, copying and successor scores.

Per head the weights are in the row-vector convention of TransformerLens: a head reads the residual stream x
through ``W_Q, W_K, W_V`` [D, d] and writes ``z W_O`` with ``W_O`` [d, D]; its OV circuit is ``W_V W_O`` and its
QK circuit ``W_Q W_K^T`` (both [D, D]).

Composition (Elhage et al. 2021; TransformerLens ``utils.composition_scores``): for a writer head A in an earlier
layer and a reader head B in a later layer, ``||W_OV^A M_B||_F / (||W_OV^A||_F ||M_B||_F)`` with ``M_B`` the
reader's ``W_QK`` (Q-composition), ``W_QK^T`` (K-composition) or ``W_OV`` (V-composition). It is computed as
``<G_A, G_B>_F`` of the Gram matrices ``G_A = W_OV^T W_OV`` and ``G_B = M M^T`` (one matrix product over every
pair of heads).

Weights are prepared as TransformerLens does before it computes them (``fold_ln``, ``center_writing_weights``):

- normalisation folding: the scale (gamma) of the norm right before a head's input (RMSNorm or LayerNorm) is
  folded into its ``W_Q, W_K, W_V``; the per-head q/k norms of Qwen3/Gemma-3 fold their gamma into the columns of
  ``W_Q, W_K``; a norm right after the attention output (BERT's post-LN, Gemma's post-attention norm) folds its
  gamma into ``W_O``. The division by the token's norm is a positive scale per token and is left out;
- LayerNorm models (BERT, GPT-2) centre reading and writing weights (LayerNorm removes the mean of the residual:
  the all-ones direction carries nothing), so their null lives in D - 1 dimensions;
- grouped keys and values: query head h reads the key/value head ``h // (H / KV)`` (transformers' repeat_kv),
  so the heads of one group share ``W_K`` and ``W_V``;
- rotary embeddings rotate queries and keys by an angle that depends on the offset between them: the scores use
  the unrotated ``W_Q W_K^T`` (offset 0). Values are not rotated, so V-composition is exact.

Null of random orientations: with the writer's output space rotated by a uniformly random rotation U of the
D_eff-dimensional residual space, ``s^2 = <G_A, U G_B U^T> / (tr G_A tr G_B)`` has mean exactly 1 / D_eff and
variance ``2 (D p_A - 1)(D p_B - 1) / (D^2 (D - 1)(D + 2))`` with ``p = tr(G^2) / tr(G)^2`` and D = D_eff (the
moments of a Haar-random rotation), so ``z = (s^2 - 1/D) / sd``, one-sided p from the normal, FDR over the pairs
of one mode. The shuffled-heads z compares a pair's score to every earlier -> later pair of the model
(``(s - mean) / sd`` over those pairs).

Copying (Elhage et al.; McDougall et al. 2023's extended embedding): the tokens of a fixed list are embedded,
passed through the first MLP (``e + MLP_0(norm(e))``), normalised, through one head's OV circuit and the
unembedding (final-norm gamma folded). A token is copied when its own logit is among the top 5 of its row
(restricted to the list), negatively copied when among the bottom 5. Successor score (Gould et al. 2024): the
share of ordinal tokens (numbers, number words, ordinals, days, months, letters) whose successor ranks first
among the tokens of its task. Per-token positive scales (RMS division, the final norm) do not change the ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..core.models import ARCHITECTURES, architecture_module, word_embeddings
from ..detectors.sequences import ordinary_ids

MODES = ("q", "k", "v")
# the attention weight layouts head_weights reads, named by a model type's ``weight_layout`` in
# core.models.ARCHITECTURES (a type with No(why) there: these scores are skipped with the reason)
LAYOUTS = ("bert", "gpt2", "llama")
SUCCESSOR_TASKS = {
    "numbers": [str(i) for i in range(1, 31)],
    "number_words": "one two three four five six seven eight nine ten eleven twelve".split(),
    "ordinals": "first second third fourth fifth sixth seventh eighth ninth tenth".split(),
    "days": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    "months": "January February March April May June July August September October November December".split(),
    "letters": list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
}
CYCLIC = {"days", "months"}
_WORD = re.compile(r"^ ?[A-Za-z]{3,}$")


class UnsupportedModel(ValueError):
    """A model whose weights this module cannot read; the message is the reason written to the tables."""


@dataclass
class HeadWeights:
    """Per-head weights, folded and centred as the module docstring says: ``q, k, v`` [L, H, D, d] (keys and
    values repeated over the query heads of a group), ``o`` [L, H, d, D]."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    norm: str  # 'layernorm' (centred) or 'rmsnorm'
    kv_heads: int
    layout: str  # one of LAYOUTS

    @property
    def shape(self) -> tuple[int, int, int, int]:
        n_layers, n_heads, d_model, d_head = self.q.shape
        return n_layers, n_heads, d_model, d_head

    @property
    def d_eff(self) -> int:
        """Dimensions of the residual space the heads read and write (D - 1 after LayerNorm centring)."""
        return self.shape[2] - (1 if self.norm == "layernorm" else 0)


def layout(config) -> str:
    """The model type's weight layout (one of :data:`LAYOUTS`), from its row of the architecture table."""
    arch = ARCHITECTURES.get(config.model_type)
    if arch is None:
        raise UnsupportedModel(f"model type {config.model_type!r}: not in core.models.ARCHITECTURES")
    if not isinstance(arch.weight_layout, str):
        raise UnsupportedModel(f"model type {config.model_type!r}: {arch.weight_layout.why}")
    if arch.weight_layout not in LAYOUTS:
        raise UnsupportedModel(
            f"model type {config.model_type!r}: weight layout {arch.weight_layout!r} is none of {', '.join(LAYOUTS)}"
        )
    return arch.weight_layout


def _module(model, path: str):
    m = architecture_module(model, path)
    if m is None:
        raise UnsupportedModel(f"model type {model.config.model_type!r}: no module {path!r}")
    return m


def _w(module) -> np.ndarray:
    return module.weight.detach().double().cpu().numpy()


def _gamma(module, model_type: str) -> np.ndarray:
    """A norm's scale (Gemma's RMSNorm multiplies by 1 + weight)."""
    g = _w(module)
    return 1.0 + g if model_type.startswith("gemma") else g


def _split_in(w: np.ndarray, n: int) -> np.ndarray:
    """nn.Linear weight [n * d, D] -> [n, D, d]."""
    return w.reshape(n, -1, w.shape[1]).transpose(0, 2, 1)


def head_weights(model) -> HeadWeights:
    """The folded, centred per-head weights of a loaded base model (or a model with a head: its base is found)."""
    config = model.config
    lay = layout(config)
    mt = config.model_type
    n_layers, n_heads, d_model = config.num_hidden_layers, config.num_attention_heads, config.hidden_size
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    qs, ks, vs, os_ = [], [], [], []
    for layer in range(n_layers):
        g_out = np.ones(d_model)
        if lay == "bert":
            p = f"encoder.layer.{layer}.attention"
            wq, wk, wv = (_w(_module(model, f"{p}.self.{n}")) for n in ("query", "key", "value"))
            wo = _w(_module(model, f"{p}.output.dense"))
            before = "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"
            g_in = _gamma(_module(model, before), mt)
            if layer == 0 and architecture_module(model, "embeddings_project") is not None:
                g_in = np.ones(d_model)  # ELECTRA-small: a projection, not the norm, writes the first residual
            g_out = _gamma(_module(model, f"{p}.output.LayerNorm"), mt)
            kv = n_heads
        elif lay == "gpt2":
            p = f"h.{layer}"
            w = _w(_module(model, f"{p}.attn.c_attn")).T  # Conv1D [D, 3D] -> Linear layout [3D, D]
            wq, wk, wv = np.split(w, 3, axis=0)
            wo = _w(_module(model, f"{p}.attn.c_proj")).T
            g_in = _gamma(_module(model, f"{p}.ln_1"), mt)
            kv = n_heads
        else:
            p = f"layers.{layer}"
            wq, wk, wv, wo = (_w(_module(model, f"{p}.self_attn.{n}_proj")) for n in ("q", "k", "v", "o"))
            g_in = _gamma(_module(model, f"{p}.input_layernorm"), mt)

            for name, target in (("q_norm", "q"), ("k_norm", "k")):
                m = architecture_module(model, f"{p}.self_attn.{name}")
                if m is not None and getattr(m, "weight", None) is not None:
                    g = _gamma(m, mt)  # [d], the same for every head
                    if target == "q":
                        wq = (wq.reshape(n_heads, -1, d_model) * g[None, :, None]).reshape(wq.shape)
                    else:
                        wk = (wk.reshape(n_kv, -1, d_model) * g[None, :, None]).reshape(wk.shape)
            if architecture_module(model, f"{p}.pre_feedforward_layernorm") is not None:  # Gemma 2/3: sandwich norms
                g_out = _gamma(_module(model, f"{p}.post_attention_layernorm"), mt)
            kv = n_kv
        group = np.arange(n_heads) // (n_heads // kv)
        qs.append(_split_in(wq, n_heads) * g_in[None, :, None])
        ks.append((_split_in(wk, kv) * g_in[None, :, None])[group])
        vs.append((_split_in(wv, kv) * g_in[None, :, None])[group])
        os_.append(wo.reshape(d_model, n_heads, -1).transpose(1, 2, 0) * g_out[None, None, :])  # [H, d, D]
    q, k, v, o = (np.stack(x) for x in (qs, ks, vs, os_))
    norm = "rmsnorm" if lay == "llama" else "layernorm"
    if norm == "layernorm":  # centre reading (over D, the rows) and writing weights (over D, the columns)
        q, k, v = (x - x.mean(2, keepdims=True) for x in (q, k, v))
        o = o - o.mean(3, keepdims=True)
    return HeadWeights(q=q, k=k, v=v, o=o, norm=norm, kv_heads=n_kv, layout=lay)


def _gram(left: np.ndarray, mid: np.ndarray):
    """Per head: the D x D Gram ``left mid left^T`` as its upper triangle (off-diagonal entries times sqrt 2, so
    that a dot product of two rows is the Frobenius product of the symmetric matrices; float32), its trace and
    the trace of its square (from the d x d product ``mid left^T left``). left [N, D, d], mid [N, d, d]. The
    full D x D products are formed a few heads at a time (256 MiB of them at most)."""
    import torch

    lt, mt = torch.as_tensor(left), torch.as_tensor(mid)
    small = mt @ (lt.transpose(1, 2) @ lt)
    tr = torch.einsum("nii->n", small).numpy()
    tr2 = (small * small.transpose(1, 2)).sum((1, 2)).numpy()
    n, d_model = left.shape[:2]
    i, j = torch.triu_indices(d_model, d_model)
    scale = torch.where(i == j, 1.0, 2.0**0.5).float()
    out = np.empty((n, len(i)), np.float32)
    step = max(1, 2**28 // (4 * d_model * d_model))
    for s in range(0, n, step):
        l32 = lt[s : s + step].float()
        g = (l32 @ mt[s : s + step].float()) @ l32.transpose(1, 2)
        torch.mul(g[:, i, j], scale, out=torch.from_numpy(out[s : s + step]))
    return out, tr, tr2


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b through torch (BLAS for any strides and batch shapes; numpy's stacked matmul is not)."""
    import torch

    return (torch.as_tensor(a) @ torch.as_tensor(b)).numpy()


def reader_factors(hw: HeadWeights, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(left [N, D, d], mid [N, d, d]) with ``M M^T = left mid left^T`` for the reader matrix M of ``mode``."""
    n_layers, n_heads, d_model, d_head = hw.shape
    q, k, v = (x.reshape(-1, d_model, d_head) for x in (hw.q, hw.k, hw.v))
    o = hw.o.reshape(-1, d_head, d_model)
    gram = lambda x: _matmul(x.transpose(0, 2, 1), x)  # noqa: E731
    if mode == "q":  # W_QK = W_Q W_K^T
        return q, gram(k)
    if mode == "k":  # W_QK^T = W_K W_Q^T
        return k, gram(q)
    if mode == "v":  # W_OV = W_V W_O
        return v, _matmul(o, o.transpose(0, 2, 1))
    raise ValueError(f"composition mode must be one of {MODES}, not {mode!r}")


def composition(hw: HeadWeights, max_layer_gap: int | None = None, memory_gb: float = 4.0) -> dict[str, np.ndarray]:
    """Per mode [3, N, N] (writer, reader; N = L x H heads in layer-major order; NaN except the scored pairs):
    ``score``, ``z`` (random orientations), ``null_sd`` of s^2; ``causal`` [N, N] the pairs writer layer < reader
    layer, ``scored`` [N, N] those at most ``max_layer_gap`` layers apart (None: every causal pair).

    Memory: the Gram triangles held at once (float32, D(D+1)/2 per head) are a block of writer heads and a chunk of
    one layer's reader heads, at most ``memory_gb`` GiB together (at least two heads). When the writers do not fit
    in one block the readers' Grams are rebuilt for every block; the scores are the same for any ``memory_gb``."""
    n_layers, n_heads, d_model, d_head = hw.shape
    n = n_layers * n_heads
    layer = np.repeat(np.arange(n_layers), n_heads)
    gap = n_layers if max_layer_gap is None else int(max_layer_gap)
    causal = layer[:, None] < layer[None, :]
    scored = causal & (layer[None, :] - layer[:, None] <= gap)
    hold = max(2, int(memory_gb * 2**30) // (2 * d_model * (d_model + 1)))  # Gram triangles in memory
    n_read = min(n_heads, hold // 2)
    n_write = hold - n_read
    v = hw.v.reshape(n, d_model, d_head)
    o = hw.o.reshape(n, d_head, d_model)
    wmid = _matmul(v.transpose(0, 2, 1), v)  # W_OV^T W_OV = W_O^T (W_V^T W_V) W_O
    readers = [reader_factors(hw, mode) for mode in MODES]
    dim = hw.d_eff
    score = np.full((len(MODES), n, n), np.nan)
    z, sd = score.copy(), score.copy()
    writers = (n_layers - 1) * n_heads  # the last layer's heads write to no later head
    for w0 in range(0, writers, n_write):
        w1 = min(w0 + n_write, writers)
        ga, tra, tra2 = _gram(o[w0:w1].transpose(0, 2, 1), wmid[w0:w1])
        pa = tra2 / tra**2
        for mi, (left, mid) in enumerate(readers):
            for rl in range(layer[w0] + 1, min(n_layers, layer[w1 - 1] + gap + 1)):
                # readers of layer rl against the block's writers below it, at most gap layers below
                w = slice(max(w0, (rl - gap) * n_heads), min(w1, rl * n_heads))
                wb = slice(w.start - w0, w.stop - w0)  # the same writers' rows of ga
                for r0 in range(rl * n_heads, (rl + 1) * n_heads, n_read):
                    r = slice(r0, min(r0 + n_read, (rl + 1) * n_heads))
                    gb, trb, trb2 = _gram(left[r], mid[r])
                    s2 = np.maximum(_matmul(ga[wb], gb.T).astype(np.float64), 0.0) / (tra[wb, None] * trb[None, :])
                    pb = trb2 / trb**2
                    var = 2 * (dim * pa[wb, None] - 1) * (dim * pb[None, :] - 1) / (dim**2 * (dim - 1) * (dim + 2))
                    score[mi, w, r] = np.sqrt(s2)
                    sd[mi, w, r] = np.sqrt(np.maximum(var, 1e-30))
                    z[mi, w, r] = (s2 - 1.0 / dim) / sd[mi, w, r]
        del ga  # before the next block's
    return {"score": score, "z": z, "null_sd": sd, "causal": causal, "scored": scored}


# --- copying and successor scores ----------------------------------------------------------------------------


def copy_tokens(tokenizer, n_tokens: int, seed: int) -> np.ndarray:
    """The fixed token list of the copying scores: ``n_tokens`` ordinary tokens (detectors' definition) that
    decode to one alphabetic word of at least 3 letters (with its leading space for byte-level BPE), drawn with
    ``seed``, sorted."""
    ids = ordinary_ids(tokenizer)
    texts = tokenizer.batch_decode([[int(i)] for i in ids])
    ok = np.array([bool(_WORD.match(t)) for t in texts])
    spaced = np.array([t.startswith(" ") for t in texts])
    if (ok & spaced).sum() >= n_tokens:  # byte-level BPE: words with their leading space
        ok &= spaced
    pool = ids[ok]
    if len(pool) < 10:
        raise UnsupportedModel(f"only {len(pool)} word tokens in the vocabulary, too few for copying scores")
    rng = np.random.default_rng([seed, len(pool)])
    return np.sort(rng.choice(pool, size=min(n_tokens, len(pool)), replace=False))


def single_token(tokenizer, word: str) -> int | None:
    """The id of ``word`` as one token, with a leading space first (a word inside text), else bare; None if
    neither is one token."""
    for text in (" " + word, word):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            return int(ids[0])
    return None


def successor_items(tokenizer) -> list[tuple[str, list[int], list[int]]]:
    """Per task: (name, token ids of its items in order, for each item the index of its successor or -1). An item
    that is not one token ends the run of items before it (its neighbours have no successor across it)."""
    out = []
    for name, words in SUCCESSOR_TASKS.items():
        ids = [single_token(tokenizer, w) for w in words]
        keep = [i for i, t in enumerate(ids) if t is not None]
        if len(set(ids[i] for i in keep)) < len(keep) or len(keep) < 3:
            continue
        pos = {i: j for j, i in enumerate(keep)}
        succ = []
        for i in keep:
            nxt = (i + 1) % len(words) if name in CYCLIC else i + 1
            succ.append(pos.get(nxt, -1) if nxt < len(words) else -1)
        out.append((name, [ids[i] for i in keep], succ))
    return out


def extended_embedding(model, ids: np.ndarray) -> np.ndarray:
    """``e + MLP_0(norm(e))`` of token ``ids`` [T] -> [T, D] (first layer's MLP with its own norms; attention of
    layer 0 left out), for the pre-norm families."""
    import torch

    lay = layout(model.config)
    if lay == "bert":
        raise UnsupportedModel("post-LN encoder: no extended embedding")
    with torch.inference_mode():
        e = word_embeddings(model)(torch.as_tensor(np.asarray(ids), dtype=torch.long))
        if lay == "gpt2":
            blk = _module(model, "h.0")
            m = blk.mlp(blk.ln_2(e))
        else:
            blk = _module(model, "layers.0")
            if architecture_module(model, "layers.0.pre_feedforward_layernorm") is not None:
                m = blk.post_feedforward_layernorm(blk.mlp(blk.pre_feedforward_layernorm(e)))
            else:
                m = blk.mlp(blk.post_attention_layernorm(e))
        return (e + m).double().cpu().numpy()


def unembedding(lm_model) -> np.ndarray:
    """W_U [V, D] of a model with an LM head, the final norm's gamma folded (centred for LayerNorm)."""
    base = lm_model.base_model
    lay = layout(lm_model.config)
    w = lm_model.get_output_embeddings().weight.detach().double().cpu().numpy()
    final = _module(base, "ln_f" if lay == "gpt2" else "norm")
    w = w * _gamma(final, lm_model.config.model_type)[None, :]
    return w - w.mean(1, keepdims=True) if lay == "gpt2" else w


def _normalise(x: np.ndarray, norm: str) -> np.ndarray:
    if norm == "layernorm":
        x = x - x.mean(1, keepdims=True)
    return x / np.sqrt((x**2).mean(1, keepdims=True))


def ov_logits(hw: HeadWeights, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """[N, T, T'] logits of every head's OV circuit: rows ``x`` [T, D] (extended embeddings, normalised here),
    columns the unembedding rows ``u`` [T', D]."""
    n_layers, n_heads, d_model, d_head = hw.shape
    xn = _normalise(x, hw.norm)
    v = hw.v.reshape(-1, d_model, d_head)
    o = hw.o.reshape(-1, d_head, d_model)
    return _matmul(_matmul(xn[None], v), _matmul(o, u.T))


def copying(logits: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Per head and token [N, T] booleans: the token's own logit (the diagonal of ``logits`` [N, T, T]) is among
    the top ``k`` of its row (copying), among the bottom ``k`` (negative copying)."""
    diag = np.einsum("ntt->nt", logits)
    above = (logits > diag[..., None]).sum(-1)
    below = (logits < diag[..., None]).sum(-1)
    return above < k, below < k


def successor_hits(logits: np.ndarray, succ: np.ndarray) -> np.ndarray:
    """[N, items] booleans: the successor (index ``succ``, items with one) ranks first in the item's row of
    ``logits`` [N, T, T] (one task's tokens)."""
    has = succ >= 0
    return logits[:, has].argmax(-1) == succ[has][None, :]
