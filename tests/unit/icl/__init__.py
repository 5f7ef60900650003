"""Tests of headatlas.icl."""
