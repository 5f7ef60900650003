"""Tests of headatlas.report."""
