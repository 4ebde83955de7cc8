"""Tests of kvbench.suites.gate."""
