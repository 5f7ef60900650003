"""Tests of headatlas.position."""
