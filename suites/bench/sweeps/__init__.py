"""Sweep modules; each registers its sweeps on import (see suites.bench.catalog)."""
