"""Heads in circuits and in long inputs: composition, copying and successor scores read off the weights (weights),
a causal check that induction heads need previous-token heads (induction), retrieval, echo and long-range induction
heads (longrange), per-head tables and the agreement between detectors (analysis), the composition figure (figures)."""
