"""Heads in long inputs: retrieval heads (Wu et al. 2024) on needle-in-a-haystack inputs, and echo and induction
heads at long range (RazorAttention's repeated random blocks).

Needle in a haystack (following Wu et al.'s ``retrieval_head_detection.py``): WikiText-2 running text cut to the
configured length (tokens, framing and question included), a seeded needle sentence inserted at a depth (a share
of the haystack, moved back to the end of the sentence before it), then the question; the model decodes greedily
from the prompt. At each decoding step the query of the token just fed attends over every key; per head its top-1
key counts as a copy when it lies in the needle and holds the token the step generates: the run's score of the
head is (number of such steps) / (needle length). A run is *answered* when the ROUGE-1 recall of the response
against the needle exceeds ``rouge_threshold`` (0.5, Wu's 50) or, with ``answered_by_value``, when the response
holds the needle's number (a model that answers the question with the number alone has retrieved it, as in
passkey retrieval; ROUGE-1 against the whole sentence would give it 0.1); the head's retrieval score is its mean over the
answered runs (no answered run: no score, said so). Decoding feeds one token at a time with the key/value cache,
so only one query row per layer is ever materialised (the prompt is run without attention maps).

Long-range echo and induction: a block of m distinct random ordinary tokens repeated twice after the framing
(RazorAttention); echo = attention from a second-block token to its first occurrence, induction = attention to the
token after it. Both are the detectors' ``duplicate`` and ``induction`` scores
(:class:`headatlas.detectors.reducers.DetectorReducer`, one implementation), here at offset m.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..core.reduce import fused_reduce
from ..core.settings import Settings
from ..detectors.reducers import DetectorReducer
from ..detectors.registry import column
from ..detectors.sequences import frame, ordinary_ids

NEEDLE_KEYS = ("the cup", "the lighthouse", "the red door", "the old bridge", "the north tower", "the garden")
BIN_NAMES = ("0", "(0,0.1]", "(0.1,0.5]", "(0.5,1]")  # Wu et al.'s retrieval-score bins


@dataclass(frozen=True, kw_only=True)
class LongSettings(Settings):
    """analysis.circuits.long (workflow/schemas/circuits.schema.yaml); seed is analysis.circuits's own."""

    SECTION = "analysis.circuits.long"
    PARENT_KEYS = ("seed",)

    lengths: tuple[int, ...] = (1024,)
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    needles: int = 2
    max_new_tokens: int = 24
    rouge_threshold: float = 0.5
    answered_by_value: bool = True
    chat: bool = True
    block_lengths: tuple[int, ...] = (512,)
    blocks: int = 2
    seed: int = 0


@dataclass
class NeedleInput:
    """One needle-in-a-haystack prompt: ``ids`` (framing, haystack with the needle, question), the needle's token
    span [start, end) in ``ids``, the needle text (the reference of ROUGE-1), and where it came from."""

    ids: list[int]
    start: int
    end: int
    needle: str
    length: int
    depth: float
    index: int
    meta: dict = field(default_factory=dict)


def needle_text(rng: np.random.Generator) -> tuple[str, str]:
    """A seeded (needle sentence, question): a random 5-digit number kept at a named place."""
    key = NEEDLE_KEYS[int(rng.integers(len(NEEDLE_KEYS)))]
    number = int(rng.integers(10000, 100000))
    return f"The special magic number for {key} is {number}.", f"What is the special magic number for {key}?"


def period_mask(tokenizer, ids: np.ndarray) -> np.ndarray:
    """[len(ids)] True where a token's text ends a sentence ('.', '!' or '?' at its end)."""
    vocab = np.unique(ids)
    ends = np.array([t.rstrip().endswith((".", "!", "?")) for t in tokenizer.batch_decode([[int(i)] for i in vocab])])
    return ends[np.searchsorted(vocab, ids)]


_SLOT = "\u2063HAYSTACK\u2063"


def chat_frame(tokenizer) -> tuple[list[int], list[int]] | None:
    """(prefix ids, suffix ids) of the tokenizer's chat template around one user message (the generation prompt
    included), or None when it has no template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SLOT}], tokenize=False, add_generation_prompt=True
    )
    if text.count(_SLOT) != 1:
        return None
    pre, post = text.split(_SLOT)
    enc = lambda t: list(tokenizer(t, add_special_tokens=False)["input_ids"]) if t else []  # noqa: E731
    return enc(pre), enc(post)


def needle_inputs(
    tokenizer, haystack_ids: np.ndarray, settings: LongSettings, bos: int | None, max_positions: int,
    chat: tuple[list[int], list[int]] | None = None,
) -> list[NeedleInput]:  # fmt: skip
    """The seeded prompts: for each length, depth and needle (``settings.needles`` per cell) a haystack window of
    ``haystack_ids`` (a seeded start), the needle after the last sentence end before the depth, then the question;
    inside the ``chat`` frame (:func:`chat_frame`; then without ``bos``) when given, as Wu et al. prompt chat models.
    Every prompt has exactly ``length`` tokens; a length above ``max_positions`` is an error."""
    s = settings
    period = period_mask(tokenizer, haystack_ids)
    rng = np.random.default_rng([s.seed, 1])
    out = []
    for length in s.lengths:
        if length > max_positions:
            raise ValueError(
                f"analysis.circuits.long.lengths: {length} tokens is more than the model's {max_positions} positions"
            )
        for depth in s.depths:
            for _ in range(s.needles):
                needle, question = needle_text(rng)
                n_ids = tokenizer(" " + needle, add_special_tokens=False)["input_ids"]
                q_ids = tokenizer(f"\nBased on the content of the text, Question: {question}\nAnswer:",
                                  add_special_tokens=False)["input_ids"]  # fmt: skip
                framing, tail = ([] if bos is None else [bos]), []
                if chat is not None:
                    framing, tail = list(chat[0]), list(chat[1])
                room = length - len(framing) - len(n_ids) - len(q_ids) - len(tail)
                if room < 16 or room > len(haystack_ids):
                    raise ValueError(f"analysis.circuits.long.lengths: {length} tokens leave {room} for the haystack")
                begin = int(rng.integers(0, len(haystack_ids) - room + 1))
                hay = haystack_ids[begin : begin + room]
                cut = int(depth * room)
                ends = np.flatnonzero(period[begin : begin + cut])
                cut = int(ends[-1]) + 1 if len(ends) else cut
                ids = framing + hay[:cut].tolist() + list(n_ids) + hay[cut:].tolist() + list(q_ids) + tail
                start = len(framing) + cut
                out.append(
                    NeedleInput([int(i) for i in ids], start, start + len(n_ids), needle, length, float(depth), len(out),
                                {"haystack_start": begin, "question": question})
                )  # fmt: skip
    return out


_TOKEN = re.compile(r"[a-z0-9]+")


def rouge1_recall(reference: str, response: str) -> float:
    """ROUGE-1 recall (rouge_score's tokenisation: lower case, runs of [a-z0-9]; no stemming): clipped unigram
    matches / reference unigrams."""
    ref, hyp = Counter(_TOKEN.findall(reference.lower())), Counter(_TOKEN.findall(response.lower()))
    total = sum(ref.values())
    return sum(min(c, hyp[w]) for w, c in ref.items()) / total if total else 0.0


def step_top(rows, n_keys: int) -> np.ndarray:
    """[L, H] position of each head's top-1 key at one decoding step, from the step's query rows (one [H, k_l]
    array per layer over the ``n_keys`` positions so far, the query's own included). A sliding-window layer's
    cache holds only its last k_l keys (Gemma, Mistral), so index i of its row is position n_keys - k_l + i."""
    return np.stack([n_keys - r.shape[-1] + np.asarray(r).argmax(-1) for r in rows])


def holds_value(needle: str, response: str) -> bool:
    """The needle's number (its last word) appears in the response as a whole number (not inside a longer one)."""
    number = needle.rsplit(" ", 1)[-1].rstrip(".")
    return re.search(rf"(?<!\d){re.escape(number)}(?!\d)", response) is not None


def copy_hits(top: np.ndarray, generated: int, ids: np.ndarray, start: int, end: int) -> np.ndarray:
    """[L, H] booleans of one decoding step: the head's top-1 key ``top`` [L, H] lies in the needle [start, end)
    and holds the generated token (Wu et al.'s copy-paste condition)."""
    inside = (top >= start) & (top < end)
    return inside & (ids[np.clip(top, 0, len(ids) - 1)] == generated)


def _stop_ids(tokenizer) -> set[int]:
    stop = {i for i in (tokenizer.eos_token_id,) if i is not None}
    vocab = tokenizer.get_vocab()
    for piece in ("\n", "Ċ", "<0x0A>", "ĊĊ"):
        if piece in vocab:
            stop.add(vocab[piece])
    return stop


def _cache(out):
    """The key/value cache of a forward output (``cache`` in recent transformers, ``past_key_values`` before)."""
    return out.cache if "cache" in out else out.past_key_values


def decode_run(lm_model, tokenizer, item: NeedleInput, max_new_tokens: int) -> dict:
    """Greedy decoding of one prompt (the prompt without its last token prefilled, then one token per step) and
    the per-head copy-paste score of the run: ``score`` [L, H], ``response``, ``generated`` ids."""
    import torch

    ids = np.asarray(item.ids)
    stop = _stop_ids(tokenizer)
    n_layers, n_heads = lm_model.config.num_hidden_layers, lm_model.config.num_attention_heads
    hits = np.zeros((n_layers, n_heads))
    generated = []
    impl = getattr(lm_model.config, "_attn_implementation", "eager")
    params = inspect.signature(lm_model.forward).parameters
    key = "cache" if "cache" in params else "past_key_values"
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}  # the prompt's logits are never read
    dev = lm_model.get_input_embeddings().weight.device  # the first device of a split model
    with torch.inference_mode():
        try:  # the prompt: no attention maps, the fastest kernel
            lm_model.set_attn_implementation("sdpa")
        except (ValueError, AttributeError):
            pass
        try:
            out = lm_model(input_ids=torch.as_tensor(ids[None, :-1], device=dev), use_cache=True, **keep)
        finally:
            lm_model.set_attn_implementation(impl)
        past, inp = _cache(out), int(ids[-1])
        seq = ids
        for _ in range(max_new_tokens):
            step = {
                "input_ids": torch.tensor([[inp]], device=dev),
                key: past,
                "use_cache": True,
                "output_attentions": True,
            }
            out = lm_model(**step)
            past = _cache(out)
            nxt = int(out.logits[0, -1].argmax())
            rows = [a[0, :, -1, :].float().cpu().numpy() for a in out.attentions]  # one query row per layer
            hits += copy_hits(step_top(rows, len(seq)), nxt, seq, item.start, item.end)
            generated.append(nxt)
            seq = np.append(seq, nxt)
            inp = nxt
            if nxt in stop and tokenizer.decode(generated, skip_special_tokens=True).strip():
                break  # a newline or EOS ends the answer once it has begun (leading newlines are skipped)
            if nxt == tokenizer.eos_token_id:
                break
    response = tokenizer.decode(generated, skip_special_tokens=True).strip()
    return {"score": hits / (item.end - item.start), "response": response, "generated": generated}


def retrieval_runs(lm_model, tokenizer, items: list[NeedleInput], settings: LongSettings, log=None) -> dict:
    """Every prompt decoded: ``runs`` (one dict per prompt: length, depth, rouge, answered, response) and
    ``scores`` [R, L, H]."""
    runs, scores = [], []
    for item in items:
        r = decode_run(lm_model, tokenizer, item, settings.max_new_tokens)
        rouge = rouge1_recall(item.needle, r["response"])
        found = holds_value(item.needle, r["response"])
        runs.append({"run": item.index, "length": item.length, "depth": item.depth, "needle": item.needle,
                     "needle_start": item.start, "needle_end": item.end, "response": r["response"],
                     "rouge1_recall": rouge, "answered": rouge > settings.rouge_threshold or (settings.answered_by_value and found),
                     "number_found": found, "steps": len(r["generated"])})  # fmt: skip
        scores.append(r["score"])
        if log:
            log.info("needle run %d (%d tokens, depth %.2f): rouge1 %.2f %r", item.index, item.length, item.depth,
                     rouge, r["response"][:80])  # fmt: skip
    return {"runs": runs, "scores": np.stack(scores) if scores else np.zeros((0, 0, 0))}


def layer_windows(config) -> np.ndarray:
    """[L] each layer's attention window in keys, 0 for a global layer: ``sliding_window`` on the layers whose
    ``layer_types`` entry is "sliding_attention" (Gemma 2/3; transformers' configs), on every layer of a config
    with a window and no layer types (older Mistral), none without ``sliding_window``. A query at position q of
    such a layer sees key j only when q - j < window (its own key included)."""
    n = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    if not window or not getattr(config, "use_sliding_window", True):
        return np.zeros(n, dtype=int)
    types = getattr(config, "layer_types", None)
    if types is None:
        return np.full(n, int(window))
    return np.array([int(window) if t == "sliding_attention" else 0 for t in types], dtype=int)


def retrieval_bins(score: np.ndarray) -> np.ndarray:
    """Share of heads in each of Wu et al.'s bins (:data:`BIN_NAMES`) of ``score`` [heads] (finite ones)."""
    s = score[np.isfinite(score)]
    if not len(s):
        return np.full(len(BIN_NAMES), np.nan)
    counts = [(s <= 0).sum(), ((s > 0) & (s <= 0.1)).sum(), ((s > 0.1) & (s <= 0.5)).sum(), (s > 0.5).sum()]
    return np.asarray(counts, dtype=float) / len(s)


def repeated_blocks(tokenizer, kind: str, bos: int | None, m: int, n: int, seed: int, first_index: int = 0) -> list:
    """``n`` sequences of a block of ``m`` distinct random ordinary tokens repeated twice, framed as the detectors
    frame theirs (RazorAttention's long-range input)."""
    vocab = ordinary_ids(tokenizer)
    if m > len(vocab):
        raise ValueError(f"analysis.circuits.long.block_lengths: {m} distinct tokens, the vocabulary has {len(vocab)}")
    rng = np.random.default_rng([seed, m, len(vocab)])
    out = []
    for i in range(n):
        half = rng.choice(vocab, size=m, replace=False)
        out.append(frame(np.concatenate([half, half]), tokenizer, kind, bos, first_index + i))
    return out


def long_range_scores(model, tokenizer, kind: str, bos: int | None, settings: LongSettings, pad_id: int, name: str):
    """Per block length m: echo and induction scores [n_blocks, L, H] of the repeated blocks (detectors' reducer)."""
    out = {}
    for m in settings.block_lengths:
        seqs = repeated_blocks(tokenizer, kind, bos, m, settings.blocks, settings.seed)
        res = fused_reduce(model, seqs, [DetectorReducer(settings.seed)], 1, kind, None, pad_id, name, "circuits")[0]
        out[m] = {
            "echo": res["scores"][..., column("duplicate")],
            "induction": res["scores"][..., column("induction")],
        }
    return out


def top_share(x: np.ndarray, share: float) -> np.ndarray:
    """Boolean mask of the top ``share`` of heads of ``x`` [heads] (at least one; ties broken by order)."""
    k = max(1, int(round(share * len(x))))
    mask = np.zeros(len(x), dtype=bool)
    mask[np.argsort(-np.nan_to_num(x, nan=-np.inf), kind="stable")[:k]] = True
    return mask
