"""Tests of headatlas.quiet."""
