"""Tests of headatlas.detectors."""
