"""What the gate compares: result suites, verdicts, thresholds, and the records of a
candidate run and of a baseline (static costs per kernel configuration, timing series)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvbench.workloads.errors import KVBenchError

#: Result-row suites a gate run writes.
STATIC_SUITE = "gate.static"
TIMING_SUITE = "gate.timing"
CONFORMANCE_SUITE = "gate.conformance"

#: Static metrics, in table order, with their units.
STATIC_METRICS: dict[str, str] = {
    "registers": "regs/thread",
    "spills": "B",
    "shared_bytes": "B",
    "sass_instructions": "instr",
}

BASELINE_KIND = "kvbench-gate-baseline"
BASELINE_SCHEMA = 1
#: Timing targets a baseline may have (architectures are "sm_NN").
TIMING_TARGETS = ("cpu", "cuda")


class GateVerdict(str, Enum):
    """A verdict of the gate on one row. The value (lower case) is what the text table,
    the HTML fragment and `--json` show; a `FAILING` verdict makes the gate exit 1."""

    PASS = "pass"
    IMPROVED = "improved"
    NEW = "new"
    REGRESSION = "regression"
    MISSING = "missing"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


#: The verdicts that fail the gate.
FAILING = frozenset({GateVerdict.REGRESSION, GateVerdict.MISSING, GateVerdict.FAILED})


class GateInputError(KVBenchError):
    """A baseline or candidate the gate cannot use: unreadable, truncated, hand-edited,
    from another triton version, or for another device. The CLI exits 2."""


def against_own_code(series_name: str) -> bool:
    """Whether a timing series is a ratio of this tree's kernel over the baseline's frozen
    copy of it (named `*_vs_baseline`), rather than over another kind of work."""
    return series_name.endswith("_vs_baseline")


@dataclass(frozen=True)
class Thresholds:
    """What counts as a regression (all documented defaults; the CLI can override).

    Attributes:
        register_slack: registers per thread allowed above the baseline (default 0).
        shared_slack: shared-memory bytes allowed above the baseline (default 0).
        sass_pct: percent increase in SASS instructions allowed (default 2.0).
        alpha: significance level of the one-sided Mann-Whitney U test (default 0.01).
        min_effect: smallest relative increase of the median ratio that fails (0.10), for
            ratios against the baseline's own frozen code (`*_vs_baseline`): 1.0 when
            nothing changed, on any machine.
        cross_min_effect: the same for ratios against a different kind of work (e.g.
            `*_vs_sdpa`, paged against contiguous; 0.30): those depend on the machine's
            balance of memory bandwidth and compute, and moved by 11% between two
            machines of the same type with identical code.
        min_samples: fewest samples per side for a timing comparison (default 5).
    Spills have no slack: any spill the baseline did not have fails.
    """

    register_slack: int = 0
    shared_slack: int = 0
    sass_pct: float = 2.0
    alpha: float = 0.01
    min_effect: float = 0.10
    min_samples: int = 5
    cross_min_effect: float = 0.30

    def min_effect_for(self, series_name: str) -> float:
        """The minimum effect for a timing series: `min_effect` when its reference is the
        baseline's own code (a name ending `_vs_baseline`), `cross_min_effect` otherwise."""
        return self.min_effect if against_own_code(series_name) else self.cross_min_effect

    def __post_init__(self) -> None:
        """Every threshold must be a finite number inside its range (a NaN would make every
        comparison false and switch the gate off), else GateInputError naming it."""
        for name, lo, hi, integer in THRESHOLD_RANGES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise GateInputError(f"threshold {name} must be a number, got {value!r}")
            if integer and not float(value).is_integer():
                raise GateInputError(f"threshold {name} must be a whole number, got {value!r}")
            if not math.isfinite(value) or not lo <= value <= hi:
                raise GateInputError(
                    f"threshold {name} must be a finite number in [{lo:g}, {hi:g}], got {value!r}"
                )
        if not 0 < self.alpha < 1:
            raise GateInputError(f"threshold alpha must be in (0, 1), got {self.alpha!r}")


#: (field, lowest, highest, whole number?) of every Thresholds field. The upper bounds keep
#: a typo from switching a check off: a minimum effect of at most +100%, at most 100%
#: more SASS instructions, a significance level below 1.
THRESHOLD_RANGES: tuple[tuple[str, float, float, bool], ...] = (
    ("register_slack", 0, 255, True),
    ("shared_slack", 0, 1 << 20, True),
    ("sass_pct", 0.0, 100.0, False),
    ("alpha", 0.0, 1.0, False),
    ("min_effect", 0.0, 1.0, False),
    ("cross_min_effect", 0.0, 1.0, False),
    ("min_samples", 2, 1 << 20, True),
)


# --------------------------------------------------------------------------- data


def normalize_arch(arch: Any) -> str:
    """'sm_80' for 80, '80', 'sm80', 'sm_80' (GateInputError otherwise)."""
    text = str(arch).strip().lower().removeprefix("sm").lstrip("_")
    if not text.isdigit():
        raise GateInputError(f"not a CUDA architecture: {arch!r} (expected e.g. sm_80)")
    return f"sm_{int(text)}"


def normalize_target(target: Any) -> str:
    """A baseline target: 'cpu', 'cuda' or an architecture 'sm_NN'."""
    text = str(target).strip().lower()
    if text in TIMING_TARGETS:
        return text
    return normalize_arch(text)


def is_arch(target: str) -> bool:
    """Whether `target` names an architecture (static costs) rather than a timing device."""
    return target.startswith("sm_")


def config_key(config: Mapping[str, Any]) -> str:
    """Canonical text of a kernel configuration (sorted keys, compact JSON)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class StaticRecord:
    """Compiled costs of one kernel configuration for one architecture."""

    kernel: str
    config: dict[str, Any]
    arch: str
    registers: int
    spills: int
    shared_bytes: int
    sass_instructions: int

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kernel, config_key(self.config), self.arch)

    @property
    def label(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.kernel}[{cfg}]@{self.arch}"

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str) -> StaticRecord:
        """Build from a dict (an AOT record or a baseline entry); GateInputError if bad."""
        try:
            config = m["config"]
            if isinstance(config, str):
                config = json.loads(config)
            if not isinstance(config, Mapping):
                raise TypeError("config is not an object")
            values = {name: m[name] for name in STATIC_METRICS}
            for name, v in values.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise TypeError(f"{name}={v!r} is not a non-negative number")
                if float(v) != int(v):
                    raise TypeError(f"{name}={v!r} is not a whole number")
            return cls(
                kernel=str(m["kernel"]),
                config=dict(config),
                arch=normalize_arch(m["arch"]),
                **{k: int(v) for k, v in values.items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"{where}: bad static record ({exc}): {dict(m)!r:.200}") from exc


@dataclass(frozen=True)
class TimingSeries:
    """Repeat samples of one same-run timing ratio (unitless: candidate / reference)."""

    name: str
    case: dict[str, Any]
    samples: tuple[float, ...]

    @property
    def key(self) -> str:
        return config_key({"name": self.name, **self.case})

    @property
    def label(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in sorted(self.case.items()))
        return f"{self.name}[{params}]"

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class Candidate:
    """What a gate run measured (see `candidate_from_run`)."""

    run_id: str
    environment: dict[str, Any]
    triton_version: str | None
    static: list[StaticRecord] = field(default_factory=list)
    timing: list[TimingSeries] = field(default_factory=list)
    timing_device: str | None = None
    conformance: list[dict[str, Any]] = field(default_factory=list)
    #: kernel source hash (`kernels.aot.source_hash`) the static rows were measured on
    source_hash: str | None = None
    #: per architecture, how many static records were reused from a baseline, not compiled
    reused: dict[str, int] = field(default_factory=dict)
    #: sha256 of the frozen kernel source the `*_vs_baseline` ratios were measured against
    frozen_sha256: str | None = None
    #: this run's own torch kernel source and its sha256 (frozen into a new baseline)
    current_source: str | None = None
    current_sha256: str | None = None
    #: synthetic slowdown injected into the timed candidates (testing the gate), 0 if none
    injected_slowdown: float = 0.0

    def unchanged_kernels(self) -> str | None:
        """The sha256 of this run's torch kernels when they are byte for byte the frozen
        copy its `*_vs_baseline` ratios ran against and nothing was injected (an A/A
        timing run), else None."""
        same = self.current_sha256 is not None and self.current_sha256 == self.frozen_sha256
        return self.current_sha256 if same and not self.injected_slowdown else None

    def archs(self) -> list[str]:
        return sorted({r.arch for r in self.static})

    def conformance_failures(self) -> list[str]:
        """Labels of failed conformance checks ([] when all passed)."""
        return [c["label"] for c in self.conformance if not c["passed"]]


@dataclass
class Baseline:
    """A loaded, verified baseline file."""

    path: str
    target: str
    triton_version: str | None
    created: str
    source_run: str
    environment: dict[str, Any]
    static: list[StaticRecord] = field(default_factory=list)
    timing: list[TimingSeries] = field(default_factory=list)
    source_hash: str | None = None
    #: the frozen torch kernel source (timing baselines): what `*_vs_baseline` runs against
    frozen_source: str | None = None
    frozen_sha256: str | None = None


def sha256_text(text: str) -> str:
    """Hex sha256 of a text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
