"""kvbench: a conformance and benchmark harness for paged KV caches in LLM serving.

Installed, kvbench is this one import package; the repository's six package folders are
mapped under it (pyproject.toml, `package-dir`), so nothing of kvbench lands at the top
level of site-packages beside the libraries its users already have:

    kvbench.workloads   KV geometry, capacity math, presets, distributions, traces
    kvbench.reference   ContiguousKVCache and the float64 attention oracle
    kvbench.kernels     Triton kernels and their torch versions
    kvbench.paged       the paged KV cache, its allocator and the serving engine
    kvbench.reports     results store, tables, figures, HTML site, regression gate
    kvbench.suites      the conformance and bench suites and the `kvbench` CLI

Importing this package also installs `OldNameGuard`: code written against the names
kvbench used before (`import paged`, `from suites.peers.base import ...`) gets an
ImportError naming the new module instead of a second, silently different copy of kvbench
imported from a source checkout.
"""

from __future__ import annotations

from kvbench._old_names import OLD_NAMES, OldNameGuard, install_old_name_guard, new_name

__version__ = "0.1.0"

install_old_name_guard()

__all__ = ["OLD_NAMES", "OldNameGuard", "__version__", "new_name"]
