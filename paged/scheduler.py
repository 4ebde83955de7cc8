"""Moved: the serving engine is the package `kvbench.paged.engine` (this name stays for
callers of the old path)."""

from kvbench.paged.engine import Engine, RequestTooLargeError, SchedulerError

__all__ = ["Engine", "RequestTooLargeError", "SchedulerError"]
