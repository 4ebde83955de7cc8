"""Gamma arrivals with a burstiness factor (vLLM's definition): the mean rate holds for
every burstiness, burstiness 1 is Poisson (statistically, seeded), the gaps' spread
follows 1 / sqrt(burstiness), and bad values are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kvbench.paged.serving.rate import RateTrace
from kvbench.workloads.arrivals import gamma, parse_arrivals, poisson
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import Trace, TraceRequest

N = 20_000


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 8.0])
def test_mean_rate_holds_and_spread_follows_burstiness(burstiness: float) -> None:
    rate = 4.0
    t = gamma(N, np.random.default_rng(1), rate, burstiness)
    gaps = np.diff(np.concatenate(([0.0], t)))
    assert (gaps >= 0).all() and (np.diff(t) >= 0).all()
    # mean gap 1 / rate; its standard error is cv / (rate sqrt(N)), cv = 1 / sqrt(b)
    cv = 1 / math.sqrt(burstiness)
    assert abs(gaps.mean() - 1 / rate) < 5 * cv / (rate * math.sqrt(N))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_burstiness_one_is_poisson() -> None:
    """Gaps at burstiness 1 and exponential gaps at the same rate, each from its own seed:
    a two-sample Kolmogorov-Smirnov test does not tell them apart, and both fit the
    exponential distribution of mean 1 / rate; burstiness 0.3 is told apart."""
    rate = 2.5
    g = np.diff(np.concatenate(([0.0], gamma(N, np.random.default_rng(7), rate, 1.0))))
    p = np.diff(np.concatenate(([0.0], poisson(N, np.random.default_rng(8), rate))))
    assert stats.ks_2samp(g, p).pvalue > 0.01
    assert stats.kstest(g, "expon", args=(0, 1 / rate)).pvalue > 0.01
    bursty = np.diff(np.concatenate(([0.0], gamma(N, np.random.default_rng(9), rate, 0.3))))
    assert stats.ks_2samp(bursty, p).pvalue < 1e-6


def test_spec_strings_and_bad_values() -> None:
    rng = np.random.default_rng(3)
    same = gamma(50, np.random.default_rng(3), 2.0, 0.5)
    assert np.array_equal(parse_arrivals("gamma:2:0.5")(50, rng), same)
    for spec in ("gamma:2", "gamma:2:0", "gamma:2:-1", "gamma:nan:1", "gamma:2:inf", "gamma:x:1"):
        with pytest.raises(ConfigError):
            parse_arrivals(spec)
    for bad in (0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(ConfigError, match="burstiness"):
            gamma(5, rng, 1.0, bad)  # type: ignore[arg-type]


def test_rate_trace_keeps_poisson_at_one_and_scales_gamma_draws() -> None:
    base = Trace(tuple(TraceRequest(i, 0.0, 10, 5) for i in range(400)))
    poisson_trace = RateTrace.make(base, 4)
    assert (
        RateTrace.make(base, 4, 1.0).unit_arrivals.tolist() == poisson_trace.unit_arrivals.tolist()
    )
    bursty = RateTrace.make(base, 4, 0.5)
    at2 = [r.arrival for r in bursty.at(2.0).requests]
    assert at2 == pytest.approx((bursty.unit_arrivals / 2.0).tolist())
    assert bursty.at(2.0).meta["arrivals"] == "gamma:2:0.5"
    assert poisson_trace.at(2.0).meta["arrivals"] == "poisson:2"
