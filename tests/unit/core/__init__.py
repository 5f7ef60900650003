"""Tests of headatlas.core."""
