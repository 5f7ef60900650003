"""Tests of headatlas.clark."""
