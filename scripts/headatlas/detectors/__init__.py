"""Head detectors beyond the 2019 roles: previous-token, duplicate-token, induction and attention-sink heads
(TransformerLens's patterns, Olsson et al. 2022's repeated random tokens, Gu et al. 2025's sink metric),
with bootstrap CIs, a shuffled-position null and FDR control per head (docs/detectors.md)."""
