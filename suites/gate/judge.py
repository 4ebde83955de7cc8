"""Judging a candidate against a baseline: static costs exactly (with slack), timing
ratios by a one-sided Mann-Whitney U test and a minimum effect (see `suites.gate`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.suites.gate.baselines import check_compatible
from kvbench.suites.gate.model import (
    FAILING,
    STATIC_METRICS,
    Baseline,
    Candidate,
    GateInputError,
    GateVerdict,
    StaticRecord,
    Thresholds,
    TimingSeries,
    against_own_code,
    is_arch,
)


@dataclass(frozen=True)
class GateRow:
    """One line of the verdict table."""

    target: str
    subject: str
    metric: str
    baseline: float | None
    candidate: float | None
    change: str
    verdict: GateVerdict
    detail: str = ""

    @property
    def failing(self) -> bool:
        return self.verdict in FAILING


def _pct(old: float, new: float) -> str:
    if old == new:
        return "0"
    if old == 0:
        return f"+{new:g} (from 0)"
    return f"{(new - old) / old * 100:+.1f}%"


def compare_static(
    target: str,
    baseline: Sequence[StaticRecord],
    candidate: Sequence[StaticRecord],
    th: Thresholds,
) -> list[GateRow]:
    """Verdict rows for the static costs of one architecture.

    Every (kernel, config) and metric present on both sides gives a row. A configuration
    missing from the candidate is `missing` (removing one needs a deliberate baseline
    update); one only in the candidate is `new` (passes unless it spills).
    """
    rows: list[GateRow] = []
    base = {r.key: r for r in baseline if r.arch == target}
    cand = {r.key: r for r in candidate if r.arch == target}
    limits = {
        "registers": lambda b: b + th.register_slack,
        "shared_bytes": lambda b: b + th.shared_slack,
        "sass_instructions": lambda b: b * (1 + th.sass_pct / 100),
        "spills": lambda b: b,
    }
    for key in sorted(base.keys() | cand.keys()):
        b, c = base.get(key), cand.get(key)
        label = (c or b).label  # type: ignore[union-attr]
        if c is None:
            rows.append(
                GateRow(
                    target,
                    label,
                    "config",
                    None,
                    None,
                    "",
                    GateVerdict.MISSING,
                    "in the baseline, not compiled by the candidate",
                )
            )
            continue
        if b is None:
            spill = c.spills > 0
            rows.append(
                GateRow(
                    target,
                    label,
                    "spills",
                    None,
                    c.spills,
                    "",
                    GateVerdict.REGRESSION if spill else GateVerdict.NEW,
                    "new configuration" + (" that spills" if spill else ""),
                )
            )
            continue
        for metric in STATIC_METRICS:
            old, new = getattr(b, metric), getattr(c, metric)
            limit = limits[metric](old)
            if new > limit:
                verdict = GateVerdict.REGRESSION
                detail = (
                    f"new spill ({new} B)"
                    if metric == "spills" and old == 0
                    else f"above baseline {old}"
                    + (f" + slack (limit {limit:g})" if limit != old else "")
                )
            elif new < old:
                verdict, detail = GateVerdict.IMPROVED, "below baseline: consider --update-baseline"
            else:
                verdict, detail = GateVerdict.PASS, ""
            rows.append(GateRow(target, label, metric, old, new, _pct(old, new), verdict, detail))
    return rows


@dataclass(frozen=True)
class TimingJudgement:
    """Outcome of `judge_timing` on one pair of sample sets."""

    verdict: GateVerdict
    effect: float  # median(candidate) / median(baseline) - 1
    p_slower: float  # one-sided p-value that the candidate is slower
    p_faster: float


def judge_timing(
    baseline: Sequence[float],
    candidate: Sequence[float],
    th: Thresholds,
    min_effect: float | None = None,
) -> TimingJudgement:
    """Mann-Whitney U (one-sided each way) plus a minimum effect on the medians.

    `regression` when the candidate is significantly larger (p < alpha) and its median is
    more than `min_effect` (default `th.min_effect`) above the baseline's; `improved`
    symmetrically; `pass` otherwise.
    """
    effect_floor = th.min_effect if min_effect is None else min_effect
    from scipy.stats import mannwhitneyu

    if len(baseline) < th.min_samples or len(candidate) < th.min_samples:
        raise GateInputError(
            f"timing comparison needs >= {th.min_samples} samples per side, got "
            f"{len(baseline)} baseline and {len(candidate)} candidate"
        )
    if not all(math.isfinite(x) and x > 0 for x in (*baseline, *candidate)):
        raise GateInputError("timing samples must be finite and positive")
    mb, mc = statistics.median(baseline), statistics.median(candidate)
    effect = mc / mb - 1
    p_slower = float(mannwhitneyu(candidate, baseline, alternative="greater").pvalue)
    p_faster = float(mannwhitneyu(candidate, baseline, alternative="less").pvalue)
    if p_slower < th.alpha and effect > effect_floor:
        verdict = GateVerdict.REGRESSION
    elif p_faster < th.alpha and effect < -effect_floor:
        verdict = GateVerdict.IMPROVED
    else:
        verdict = GateVerdict.PASS
    return TimingJudgement(verdict, effect, p_slower, p_faster)


def compare_timing(
    target: str,
    baseline: Sequence[TimingSeries],
    candidate: Sequence[TimingSeries],
    th: Thresholds,
    unchanged_source: str | None = None,
) -> list[GateRow]:
    """Verdict rows for same-run timing ratios (median ratio shown; see `judge_timing`).

    `unchanged_source` (a sha256) says the candidate's torch kernels are byte for byte the
    baseline's frozen copy: its `*_vs_baseline` ratios then time identical code on both
    sides (an A/A test), so any difference from the baseline's is noise by construction.
    Those rows still show the figures but pass, with a detail naming the departure when
    it would otherwise have been a verdict (a sign that timing on this machine is
    unreliable)."""
    rows: list[GateRow] = []
    base = {t.key: t for t in baseline}
    cand = {t.key: t for t in candidate}
    for key in sorted(base.keys() | cand.keys()):
        b, c = base.get(key), cand.get(key)
        label = (c or b).label  # type: ignore[union-attr]
        if c is None:
            assert b is not None  # the key came from one of the two
            rows.append(
                GateRow(
                    target,
                    label,
                    "ratio",
                    b.median,
                    None,
                    "",
                    GateVerdict.MISSING,  # type: ignore[union-attr]
                    "in the baseline, not measured by the candidate",
                )
            )
            continue
        if b is None:
            rows.append(
                GateRow(
                    target,
                    label,
                    "ratio",
                    None,
                    c.median,
                    "",
                    GateVerdict.NEW,
                    "no baseline for this case",
                )
            )
            continue
        floor = th.min_effect_for(c.name)
        j = judge_timing(b.samples, c.samples, th, floor)
        detail = (
            f"p={j.p_slower:.2g} (slower), min effect {floor:.0%}, "
            f"n={len(b.samples)}/{len(c.samples)}"
        )
        if j.verdict == GateVerdict.IMPROVED:
            detail = f"p={j.p_faster:.2g} (faster): consider --update-baseline"
        verdict = j.verdict
        if unchanged_source and against_own_code(c.name):
            aa = f"A/A: kernels unchanged (torch_ops sha256 {unchanged_source[:12]})"
            if verdict != GateVerdict.PASS:
                detail = (
                    f"{aa}, so this {verdict} verdict ({detail}) is timing noise on identical "
                    "code: not judged"
                )
                verdict = GateVerdict.PASS
            else:
                detail = f"{aa}; {detail}"
        rows.append(
            GateRow(
                target,
                label,
                "ratio",
                b.median,
                c.median,
                f"{j.effect * 100:+.1f}%",
                verdict,
                detail,
            )
        )
    return rows


@dataclass
class GateResult:
    """Everything the gate decided: rows, notes, and the exit status."""

    candidate_run: str
    baselines: list[str]
    thresholds: Thresholds
    rows: list[GateRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateRow]:
        return [r for r in self.rows if r.failing]

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression (unusable input raises before a result exists)."""
        return 1 if self.failures else 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.verdict] = out.get(r.verdict, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate_run": self.candidate_run,
            "baselines": self.baselines,
            "thresholds": asdict(self.thresholds),
            "passed": not self.failures,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "notes": self.notes,
            "rows": [asdict(r) for r in self.rows],
        }


def evaluate(
    baselines: Sequence[Baseline], candidate: Candidate, th: Thresholds | None = None
) -> GateResult:
    """Compare `candidate` with every baseline (after `check_compatible`), plus its own
    conformance record: a failed check is a `failed` row. `th` defaults to `Thresholds()`."""
    th = th if th is not None else Thresholds()
    if not baselines:
        raise GateInputError("no baseline given")
    result = GateResult(candidate.run_id, [b.path for b in baselines], th)
    for b in baselines:
        result.notes.extend(check_compatible(b, candidate))
    for c in candidate.conformance:
        if not c["passed"]:
            result.rows.append(
                GateRow(
                    "conformance",
                    c["label"],
                    "oracle",
                    None,
                    None,
                    "",
                    GateVerdict.FAILED,
                    "kernel output outside the oracle tolerance",
                )
            )
    for b in baselines:
        if is_arch(b.target):
            result.rows.extend(compare_static(b.target, b.static, candidate.static, th))
        else:
            result.rows.extend(
                compare_timing(
                    b.target, b.timing, candidate.timing, th, candidate.unchanged_kernels()
                )
            )
    return result
