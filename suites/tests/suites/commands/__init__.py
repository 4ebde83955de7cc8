"""Tests of kvbench.suites.commands."""
