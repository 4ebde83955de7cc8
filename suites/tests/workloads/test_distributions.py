"""Length distributions, arrivals and generators: fits, sample means, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.workloads.arrivals import all_at_once, bursts, parse_arrivals, poisson
from kvbench.workloads.distributions import (
    PUBLISHED_MEANS,
    clipped_normal,
    conditional_means,
    fitted_lognormal,
    named,
    named_pair,
    parse_distribution,
    uniform,
)
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.sharing import generate, workload


@pytest.mark.parametrize("name", sorted(PUBLISHED_MEANS))
def test_named_fit_hits_published_mean(name: str) -> None:
    d = named(name)
    assert d.mean == pytest.approx(PUBLISHED_MEANS[name], abs=1e-4)
    assert d.lo == 1 and d.hi == 2048
    # right-skewed: the median is well below the mean
    assert d.quantile(0.5) < d.mean


@pytest.mark.parametrize("name", sorted(PUBLISHED_MEANS))
def test_sample_means_within_two_percent(name: str) -> None:
    d = named(name)
    for seed in (0, 1, 2):
        s = d.sample(np.random.default_rng(seed), 40_000)
        assert abs(s.mean() / PUBLISHED_MEANS[name] - 1) < 0.02, (seed, s.mean())
        assert s.min() >= 1 and s.max() <= 2048


@pytest.mark.parametrize("dataset", ["sharegpt", "alpaca"])
def test_pair_fit_hits_published_means_among_kept_pairs(dataset: str) -> None:
    p, o = named_pair(dataset)
    cp, co = conditional_means(p, o, 2048)
    assert cp == pytest.approx(PUBLISHED_MEANS[f"{dataset}-input"], abs=1e-4)
    assert co == pytest.approx(PUBLISHED_MEANS[f"{dataset}-output"], abs=1e-4)
    # independent check of the conditional mean by brute-force sampling and filtering
    rng = np.random.default_rng(5)
    a, b = p.sample(rng, 400_000), o.sample(rng, 400_000)
    keep = a + b <= 2048
    assert abs(a[keep].mean() / cp - 1) < 0.01 and abs(b[keep].mean() / co - 1) < 0.01


def test_workload_pairs_sample_published_means() -> None:
    wl = workload("sharegpt")
    trace = generate("sharegpt", 30_000, seed=3)
    p = np.array([r.prompt_len for r in trace.requests])
    o = np.array([r.output_len for r in trace.requests])
    assert abs(p.mean() / 161.31 - 1) < 0.02 and abs(o.mean() / 337.99 - 1) < 0.02
    assert (p + o).max() <= 2048
    assert wl.prompt.name == "sharegpt-input@2048"
    trace = generate("alpaca", 30_000, seed=4)
    p = np.array([r.prompt_len for r in trace.requests])
    o = np.array([r.output_len for r in trace.requests])
    assert abs(p.mean() / 19.31 - 1) < 0.02 and abs(o.mean() / 58.45 - 1) < 0.02


def test_seed002_clipped_normal_matches_scipy_mean() -> None:
    from scipy.stats import norm

    d = named("seed002")
    # independent check: E[clip(round(X), 200, 2048)] by numerical integration on a fine grid
    x = np.linspace(-1500, 2500, 2_000_001)
    pdf = norm.pdf(x, 500, 200)
    vals = np.clip(np.round(x), 200, 2048)
    expected = np.trapezoid(vals * pdf, x) / np.trapezoid(pdf, x)
    assert d.mean == pytest.approx(expected, abs=0.05)
    s = d.sample(np.random.default_rng(7), 40_000)
    assert s.min() == 200 and abs(s.mean() / d.mean - 1) < 0.01


@given(st.integers(1, 500), st.integers(0, 500), st.integers(0, 2**32 - 1))
def test_uniform_support_and_determinism(lo: int, width: int, seed: int) -> None:
    d = uniform(lo, lo + width)
    a = d.sample(np.random.default_rng(seed), 200)
    b = d.sample(np.random.default_rng(seed), 200)
    assert np.array_equal(a, b)
    assert a.min() >= lo and a.max() <= lo + width
    assert d.mean == pytest.approx(lo + width / 2)


@given(st.floats(5, 1500), st.floats(0.2, 2.0))
def test_lognormal_fit_any_target(mean: float, sigma: float) -> None:
    d = fitted_lognormal(mean, sigma, 1, 2048)
    assert d.mean == pytest.approx(mean, rel=1e-6)


def test_parse_specs_round_trip() -> None:
    for spec in ("fixed:7", "uniform:3:9", "normal:500:200:200:2048", "lognormal:100:1:1:2048"):
        d = parse_distribution(spec)
        assert parse_distribution(d.name).mean == pytest.approx(d.mean)
    assert parse_distribution("sharegpt-output").mean == pytest.approx(337.99, abs=1e-4)
    assert clipped_normal(500, 200, 200, 2048).mean == pytest.approx(named("seed002").mean)


@pytest.mark.parametrize(
    "spec",
    ["fixed:0", "uniform:5:2", "normal:1:0:1:5", "bogus", "fixed:x", "lognormal:3000:1:1:2048"],
)
def test_bad_specs_name_the_value(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_distribution(spec)
    assert any(part in str(info.value) for part in spec.split(":"))


def test_arrivals() -> None:
    rng = np.random.default_rng(0)
    assert np.all(all_at_once(5) == 0)
    t = poisson(50_000, rng, 4.0)
    assert np.all(np.diff(t) >= 0) and abs(t[-1] / 50_000 - 0.25) < 0.01
    b = bursts(7, 3, 2.0)
    assert b.tolist() == [0, 0, 0, 2, 2, 2, 4]
    assert parse_arrivals("burst:3:2")(7, rng).tolist() == b.tolist()
    for bad in ("poisson:-1", "burst:0:1", "weekly"):
        with pytest.raises(ConfigError, match=bad.split(":")[-1]):
            parse_arrivals(bad)


def test_generators_reproducible_and_sharing_shapes() -> None:
    a = generate("sharegpt", 50, seed=9, sharing="system-prompt", system_tokens=64, tenants=3)
    b = generate("sharegpt", 50, seed=9, sharing="system-prompt", system_tokens=64, tenants=3)
    assert a == b
    heads = {r.prompt[:64] for r in a.requests}
    assert len(heads) == 1
    assert {r.salt for r in a.requests} == {"tenant-0", "tenant-1", "tenant-2"}
    chat = generate("alpaca", 12, seed=1, sharing="multi-turn", turns=3)
    by_id = {r.id: r for r in chat.requests}
    for c in range(4):
        t0, t1 = by_id[f"c{c}t0"], by_id[f"c{c}t1"]
        assert t1.prompt[: t0.prompt_len + t0.output_len] == t0.prompt + t0.output_tokens
    par = generate("alpaca", 5, sharing="parallel", n=3)
    assert all(r.n == 3 for r in par.requests)
    beam = generate("alpaca", 5, sharing="beam", beam_width=4)
    assert all(r.beam_width == 4 for r in beam.requests)
