"""Tests of headatlas.ablation."""
