"""Tests of kvbench.suites.cli."""
