"""Tests of kvbench.reports.gate."""
