"""Acceptance tests: the golden run of every analysis, the install routes, the README and the docs."""
