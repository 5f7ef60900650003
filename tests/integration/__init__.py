"""Integration tests: tiny random models, the tiny workflow and its dry runs, runs across modules."""
