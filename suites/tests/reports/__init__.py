"""Tests of kvbench.reports."""
