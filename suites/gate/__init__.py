"""The regression gate (`kvbench gate`, `nox -s gate`): measure a candidate run, then judge
it against the committed baselines (reports/baselines/*.json).

Two kinds of evidence, judged differently because they fail differently:

* **Static costs** of every compiled kernel configuration (registers, spills, shared
  memory, SASS instruction count), from the ahead-of-time compile for one architecture.
  They are deterministic for a given source and triton version, so they are compared
  exactly, with a documented slack (`Thresholds`): any spill the baseline did not have
  fails; registers or shared memory above the baseline plus its slack (default 0) fail;
  SASS instructions up by more than `sass_pct` percent (default 2%) fail. A baseline
  from another triton version is not compared at all (`GateInputError`), since a compiler
  change moves every number.
* **Timing ratios** measured within one run (e.g. torch paged decode over contiguous SDPA
  on the same KV, repeats interleaved), so the machine's speed and load cancel. The
  candidate's ratio samples are compared with the baseline's by a one-sided Mann-Whitney
  U test *and* a minimum effect size on the medians: a regression needs
  p < `alpha` (default 0.01) and a median ratio up by more than `min_effect` (default
  10%) for a ratio against the baseline's own frozen code, or `cross_min_effect` (30%)
  for one against another kind of work (paged over SDPA), which depends on the machine.
  Noise alone does not pass both; a real slowdown of more than the effect size does.
  When the torch kernels are byte for byte the baseline's frozen copy, the
  `*_vs_baseline` ratios time identical code on both sides (A/A): they are reported, not
  judged, since any departure is noise by construction.

A baseline file (JSON, under version control, e.g. ``reports/baselines/sm90.json``) has a
*target*: an architecture (``sm_80``, ``sm_90``) for static costs, or a timing device
(``cpu``, or ``cuda`` for GPU timings). It is written only by `make_baseline` (the
``kvbench gate --update-baseline`` command) and carries a digest of its data, so a
hand-edited, damaged or truncated file is refused rather than half-read.

A candidate comes from a results run (`reports.store.reader.Run`) whose rows use the suites
`STATIC_SUITE`, `TIMING_SUITE` and `CONFORMANCE_SUITE` (written by `run`).

One package, one job per module. Measuring (imports kernels and paged): `timing` (same-run
timing ratios, repeats interleaved), `static` (the ahead-of-time compile costs of every
kernel configuration), `conformance` (the kernels against the float64 oracle: a run that
fails it cannot become a baseline) and `run` (all of it written as one results run).
Judging (pure functions of a candidate run and the baselines; imports neither kernels nor
paged, and is what this package re-exports): `model` (what is compared), `candidates` (a
candidate from a results run), `baselines` (baseline files), `judge` (the verdicts) and
`render` (text table, JSON, HTML fragment). Unusable input raises `GateInputError`
(a KVBenchError: the CLI exits 2).
"""

from __future__ import annotations

from kvbench.suites.gate.baselines import (
    check_compatible,
    load_baseline,
    make_baseline,
    write_baseline,
)
from kvbench.suites.gate.candidates import (
    candidate_from_run,
    timing_device_of,
)
from kvbench.suites.gate.judge import (
    GateResult,
    GateRow,
    TimingJudgement,
    compare_static,
    compare_timing,
    evaluate,
    judge_timing,
)
from kvbench.suites.gate.model import (
    BASELINE_KIND,
    BASELINE_SCHEMA,
    CONFORMANCE_SUITE,
    FAILING,
    STATIC_METRICS,
    STATIC_SUITE,
    TIMING_SUITE,
    TIMING_TARGETS,
    Baseline,
    Candidate,
    GateInputError,
    GateVerdict,
    StaticRecord,
    Thresholds,
    TimingSeries,
    config_key,
    is_arch,
    normalize_arch,
    normalize_target,
    sha256_text,
)
from kvbench.suites.gate.render import (
    TEMPLATE_PATH,
    format_table,
    gate_rows_as_records,
    render_html,
    to_json,
)

__all__ = [
    "BASELINE_KIND",
    "BASELINE_SCHEMA",
    "CONFORMANCE_SUITE",
    "FAILING",
    "STATIC_METRICS",
    "STATIC_SUITE",
    "TEMPLATE_PATH",
    "TIMING_SUITE",
    "TIMING_TARGETS",
    "Baseline",
    "Candidate",
    "GateInputError",
    "GateResult",
    "GateRow",
    "GateVerdict",
    "StaticRecord",
    "Thresholds",
    "TimingJudgement",
    "TimingSeries",
    "candidate_from_run",
    "check_compatible",
    "compare_static",
    "compare_timing",
    "config_key",
    "evaluate",
    "format_table",
    "gate_rows_as_records",
    "is_arch",
    "judge_timing",
    "load_baseline",
    "make_baseline",
    "normalize_arch",
    "normalize_target",
    "render_html",
    "sha256_text",
    "timing_device_of",
    "to_json",
    "write_baseline",
]
