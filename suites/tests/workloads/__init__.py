"""Tests of kvbench.workloads."""
