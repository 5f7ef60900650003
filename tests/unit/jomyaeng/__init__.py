"""Tests of headatlas.jomyaeng."""
