"""Unit tests, one folder per package of scripts/headatlas (hand-built maps and inputs with exact answers)."""
