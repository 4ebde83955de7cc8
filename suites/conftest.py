"""Shared pytest configuration of the conformance suite and the tooling tests (suites/tests).

Hypothesis profiles:
    ci        the default: bounded examples so the whole suite stays under 10 minutes on
              2 cores; no deadlines (timing is not what these tests judge).
    thorough  many more examples; chosen by KVBENCH_HYPOTHESIS_PROFILE=thorough (the
              nox posarg `--thorough` sets it).
Markers: `gpu` tests are skipped where CUDA is unavailable.

Devices: a test that takes the `device` fixture runs on the CPU and, as a `gpu` test, on
CUDA, where the ops dispatch to the compiled Triton kernels (`backend=None` or
"triton") and are compared with the float64 oracle on the CPU.
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


#: Where device-parametrized tests run: the CPU always, CUDA (a `gpu` test) where it exists.
DEVICES = (
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device a kernel, cache or model test puts its tensors on."""
    return torch.device(request.param)
