"""The exceptions every kvbench layer raises.

They live in the lowest layer so that `kernels`, `reference`, `paged` and the suites all
raise (and catch) the same types. Every error names the bad value in its message, and the
operation that raised it has changed no state (see DESIGN.md, "Bad input").
"""

from __future__ import annotations


class KVBenchError(Exception):
    """Base class of every error kvbench raises on purpose."""


class ConfigError(KVBenchError, ValueError):
    """A size, count, dtype, preset or option is invalid (zero or negative sizes,
    an unknown preset or dtype, head counts that do not divide, ...)."""


class CapacityError(KVBenchError):
    """The cache cannot hold what was asked for (admission, growth, swap space).

    Raised before anything is changed: the cache is exactly as it was.
    """


class UnknownRequestError(KVBenchError, KeyError):
    """An operation named a request id the cache does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown request"


class DuplicateRequestError(KVBenchError, ValueError):
    """Admission or fork named a request id the cache already holds."""


class ShapeError(KVBenchError, ValueError):
    """A tensor has the wrong shape, dtype, device or layout for the operation."""


class RequestStateError(KVBenchError, ValueError):
    """The request is in a state that does not allow the operation (for example,
    appending to a request that is swapped out, or a prompt longer than max_seq_len)."""


class CaseSkipped(KVBenchError):
    """A bench case cannot run here (a peer not installed, no GPU, ...); the message says
    why. The bench records the case as skipped with that reason, not as failed."""
