"""Tests of headatlas.atlas."""
