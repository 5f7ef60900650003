"""Attention patterns shared by more than one analysis (one definition each).

:func:`prev_token_score` is Clark et al.'s "attention to the previous token" (shared methods §3.3),
``(1/n) sum_{i >= 1} A[i, i-1]``: the query at position 0, which has no previous token, counts in n.
Clark's surface statistics and the previous-token detector both read it from each query's attention to its
previous token (the layer view's target ``offset:-1``); ``n`` is the sequence length, an int or an array /
tensor broadcastable against the leading dimensions (padded batches: cells outside a sequence must be 0).

:func:`local_band` is Pande et al.'s local window, the key offsets j - i a query's ``local`` attention is
summed over; the sieves' ``local`` role and the position statistics both take it from here.
"""

from __future__ import annotations


def prev_token_score(prev, n):
    """``(1/n) sum_i prev[..., i]``: ``prev`` [..., n] each query's attention to its previous token (0 at i = 0)."""
    return prev.sum(-1) / n


def local_band(window: int, causal: bool) -> range:
    """The key offsets j - i of Pande's local window: -window..window, i itself included (j <= i under a
    causal mask)."""
    return range(-window, (0 if causal else window) + 1)
