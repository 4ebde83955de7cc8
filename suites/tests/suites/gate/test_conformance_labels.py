"""The gate's conformance cases name the attention path that ran (`cpu-cpp`, `torch-sdpa`
or `triton`), not only the `backend=` argument: on a CPU "torch" runs either the C++
kernel or gather + SDPA."""

from __future__ import annotations

import torch

from kvbench.kernels import cpu_paged
from kvbench.reports.kernel_labels import CPU_CPP, TORCH_SDPA, TRITON
from kvbench.suites.gate import conformance


def test_torch_attention_checks_name_the_cpu_path_here():
    expected = CPU_CPP if cpu_paged.status().path == "cpp" else TORCH_SDPA
    cpu = torch.device("cpu")
    decode = list(conformance.check_decode("torch", torch.float32, cpu))
    prefill = list(conformance.check_prefill("torch", torch.float32, cpu))
    assert decode and prefill
    for result in decode + prefill:
        assert result.case["backend"] == expected, result.case
        assert result.passed, result


def test_cache_writes_and_triton_keep_their_backend_name():
    cpu = torch.device("cpu")
    writes = list(conformance.check_cache_writes("torch", cpu))
    assert {r.case["backend"] for r in writes} == {"torch"}
    assert conformance._attention_path("triton", cpu) == TRITON
    assert conformance._attention_path("torch", torch.device("meta")) == TORCH_SDPA
