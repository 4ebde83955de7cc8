"""Shared pytest configuration of the conformance suite and the tooling tests (suites/tests).

Hypothesis profiles:
    ci        the default: bounded examples so the whole suite stays under 10 minutes on
              2 cores; no deadlines (timing is not what these tests judge).
    thorough  many more examples; chosen by KVBENCH_HYPOTHESIS_PROFILE=thorough (the
              nox posarg `--thorough` sets it).
Markers: `gpu` tests are skipped where CUDA is unavailable.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("KVBENCH_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests on machines without CUDA, with a reason that says so."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
