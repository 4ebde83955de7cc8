"""Tests of kvbench.suites.bench."""
