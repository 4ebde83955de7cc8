"""Suites: the conformance suite (pytest + hypothesis), the bench suite and the `kvbench` CLI.

The top layer: it may import every other kvbench package.
"""
