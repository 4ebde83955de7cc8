"""The fixed mutant list of `nox -s mutants` (docs/mutants.md): the canary first, then
the cache and references (`catalog_paged`), the kernels and the workload math
(`catalog_kernels`). Entries are checked against the tree by `model.problems` (the
tooling test suites/tests/suites/mutants/test_catalog.py runs it in CI)."""

from __future__ import annotations

from kvbench.suites.mutants.catalog_kernels import KERNELS, WORKLOADS
from kvbench.suites.mutants.catalog_paged import PAGED
from kvbench.suites.mutants.model import Mutant

MUTANTS: list[Mutant] = [*PAGED, *KERNELS, *WORKLOADS]
