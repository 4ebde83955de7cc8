"""Tests of kvbench.suites."""
