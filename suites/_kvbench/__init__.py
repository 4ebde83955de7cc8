"""kvbench: a conformance and benchmark harness for paged KV caches in LLM serving.

Installed, kvbench is this one import package; the repository's six package folders are
mapped under it (pyproject.toml, `package-dir`), so nothing of kvbench lands at the top
level of site-packages beside the libraries its users already have:

    kvbench.workloads   KV geometry, capacity math, presets, distributions, traces
    kvbench.reference   ContiguousKVCache and the float64 attention oracle
    kvbench.kernels     Triton kernels and their torch versions
    kvbench.paged       the paged KV cache, its allocator and the serving engine
    kvbench.reports     results store, tables, figures, HTML site
    kvbench.suites      the conformance and bench suites, the regression gate, the CLI
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
