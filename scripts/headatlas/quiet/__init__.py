"""Heads by what they do not do: positional (Voita et al. 2019), dormant, rigid and the massive activations behind
the sinks (Sun et al. 2024); docs/quiet_heads.md."""
