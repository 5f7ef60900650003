"""Tests of headatlas.circuits."""
