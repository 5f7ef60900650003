"""Tests of headatlas.pande."""
