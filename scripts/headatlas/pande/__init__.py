"""Pande et al. 2021, The Heads Hypothesis: sieve-bias scores, per-head tests, figures, fine-tuning."""
