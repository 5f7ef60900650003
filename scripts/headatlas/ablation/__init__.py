"""Ablations: mean (or zero) ablation of heads at their output projection, attribution patching,
role ablation against matched random head sets, pruning curves (docs/ablation.md)."""
