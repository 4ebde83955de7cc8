"""Achieved fractions of a device's datasheet peaks: what a fitted GPU profile carries.

A `DeviceProfile` keeps its datasheet figures; an `Efficiency` beside them says how much
of each the measured kernels reach and what every kernel costs at least:

    effective HBM bandwidth = hbm_fraction  x datasheet HBM bandwidth
    effective FLOP/s        = flops_fraction x datasheet peak FLOP/s
    kernel floor            = kernel_floor_s, added once per linear-layer kernel

`DATASHEET` (fractions 1, floor 0) is the uncalibrated profile. Fitted values come from
`kvbench.workloads.gpu_fit` and are shipped with their source in
`kvbench.workloads.fitted_gpu`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.workloads.errors import ConfigError


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the datasheet peaks a device achieves, and a per-kernel floor.

    Attributes:
        hbm_fraction: achieved / datasheet HBM bandwidth, in (0, 1].
        flops_fraction: achieved / datasheet dense FLOP/s, in (0, 1].
        kernel_floor_s: fixed time of one linear-layer kernel (launch, ramp-up), s, >= 0.
        source: where the numbers come from ("datasheet" or the fit's data and command).
        fitted_on: the models the fit used ("org/model" names; empty for the datasheet).
        from_profile: set when these values were fitted on another profile's device and
            transferred (an assumption the source states); "" when measured on this one.
    """

    hbm_fraction: float = 1.0
    flops_fraction: float = 1.0
    kernel_floor_s: float = 0.0
    source: str = "datasheet"
    fitted_on: tuple[str, ...] = ()
    from_profile: str = ""

    def __post_init__(self) -> None:
        for name in ("hbm_fraction", "flops_fraction"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 1):
                raise ConfigError(f"{name} must be in (0, 1], got {v!r}")
        v = self.kernel_floor_s
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"kernel_floor_s must be finite >= 0, got {v!r}")

    @property
    def label(self) -> str:
        """'datasheet', 'fitted' or 'fitted:<profile>' (transferred from that profile's
        fit): the word rows and pages record."""
        if not self.fitted_on:
            return "datasheet"
        return f"fitted:{self.from_profile}" if self.from_profile else "fitted"


DATASHEET = Efficiency()
