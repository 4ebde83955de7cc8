"""Seeded token-length distributions for prompts and outputs.

Every distribution here is a *discrete* probability mass function over the integers
[lo, hi]. That makes three things exact rather than approximate: the mean (a finite sum,
used to fit the named workloads to published statistics), sampling (inverse CDF on a
numpy Generator, so a seed reproduces a workload on any machine), and the support (no
sample ever falls outside [lo, hi]).

Named distributions and how they were fitted
--------------------------------------------
The PagedAttention paper (Kwon et al., 2023; figures quoted in [PA-deep-dive] and the issue)
reports dataset means only: ShareGPT prompts 161.31 / outputs 337.99 tokens, Alpaca
19.31 / 58.45, both right-skewed with lengths up to about 2,000 tokens. We model each
as a log-normal, discretised to integers (mass of k = P(k - 0.5 < X <= k + 0.5)) and
truncated to [1, 2048] (renormalised, so there is no spike at the cap). The shape
parameter sigma is an assumption (the paper publishes histograms, not moments beyond
the mean): 1.1 / 1.0 for ShareGPT input / output and 0.6 / 0.9 for Alpaca, which give
the long right tails the paper's histograms show. The location mu is then solved by
bisection so that the *discrete truncated* mean equals the published mean to within
1e-6 tokens; `LengthDistribution.mean` is that exact mean, and the conformance tests
check both the fit and that sample means land within a few percent of it.

    name              sigma  mean      median  p99    std
    sharegpt-input    1.1    161.31    91      1086   209
    sharegpt-output   1.0    337.99    225     1651   334
    alpaca-input      0.6     19.31    16        65    13
    alpaca-output     0.9     58.45    39       316    65

Traces keep only pairs with prompt + output <= 2,048 (the context the contiguous
baseline reserves), which would shorten both means by about 3% (ShareGPT); the
workloads therefore use `named_pair`, a joint fit whose mu's put the means *of the kept
pairs* on the published figures (the marginal fits above remain available by name).

[paged-sim]'s workload is a normal(500, 200) clipped to [200, 2048] (clipping puts the
mass below 200 on 200 itself, as `np.clip` would); its exact mean is 505.86.

Spec strings (for the CLI and sweep grids): "fixed:N", "uniform:LO:HI",
"normal:MEAN:STD:LO:HI" (clipped), "lognormal:MEAN:SIGMA:LO:HI" (fitted, truncated),
or one of the names above.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import require_positive

#: Published dataset means (tokens) the named log-normals are fitted to.
PUBLISHED_MEANS: dict[str, float] = {
    "sharegpt-input": 161.31,
    "sharegpt-output": 337.99,
    "alpaca-input": 19.31,
    "alpaca-output": 58.45,
}

#: Assumed log-normal shape (sigma) of each named distribution (see module docstring).
_SIGMAS: dict[str, float] = {
    "sharegpt-input": 1.1,
    "sharegpt-output": 1.0,
    "alpaca-input": 0.6,
    "alpaca-output": 0.9,
}

#: Upper length bound of the named workloads ("up to about 2,000 tokens").
MAX_LEN = 2048
#: Largest length a distribution's support may reach: the pmf is an array over the
#: support, so a spec of 10^30 tokens must be refused, not allocated (8 MiB at 2^20).
MAX_SUPPORT = 1 << 20
#: Range of a normal's std or a log-normal's sigma: a spread of 1e-320 overflows the
#: edges (k - mean) / std to infinity; below 1e-3 a distribution is a fixed length.
SPREAD_RANGE = (1e-3, 1e9)


@dataclass(frozen=True)
class LengthDistribution:
    """A discrete length distribution on the integers [lo, hi].

    Attributes:
        name: spec string that rebuilds it (see `parse_distribution`).
        lo, hi: support bounds, inclusive, lo >= 1.
        pmf: probabilities of lo, lo+1, ..., hi (sums to 1).
    """

    name: str
    lo: int
    hi: int
    pmf: np.ndarray = field(repr=False, compare=False)
    #: the CDF of `pmf` (its last entry exactly 1), set by __post_init__
    _cdf: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lo < 1 or self.hi < self.lo:
            raise ConfigError(f"length support [{self.lo}, {self.hi}] must satisfy 1 <= lo <= hi")
        pmf = np.asarray(self.pmf, dtype=np.float64)
        if pmf.shape != (self.hi - self.lo + 1,) or not np.all(pmf >= 0) or pmf.sum() <= 0:
            raise ConfigError(
                f"distribution {self.name!r}: pmf does not cover [{self.lo}, {self.hi}]"
            )
        pmf = pmf / pmf.sum()
        cdf = np.cumsum(pmf)
        cdf[-1] = 1.0
        object.__setattr__(self, "pmf", pmf)
        object.__setattr__(self, "_cdf", cdf)

    @property
    def values(self) -> np.ndarray:
        """The support as an int64 array."""
        return np.arange(self.lo, self.hi + 1, dtype=np.int64)

    @property
    def mean(self) -> float:
        """Exact mean of the distribution (tokens)."""
        return float(np.dot(self.values, self.pmf))

    @property
    def std(self) -> float:
        """Exact standard deviation (tokens)."""
        v = self.values.astype(np.float64)
        return float(math.sqrt(max(np.dot(v * v, self.pmf) - self.mean**2, 0.0)))

    def quantile(self, q: float) -> int:
        """Smallest length whose CDF reaches q (0 < q <= 1)."""
        if not 0 < q <= 1:
            raise ConfigError(f"quantile must be in (0, 1], got {q!r}")
        return int(self.lo + np.searchsorted(self._cdf, q, side="left"))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths drawn by inverse CDF from `rng` (int64 array)."""
        if n < 0:
            raise ConfigError(f"sample count must be >= 0, got {n!r}")
        u = rng.random(n)
        idx = np.searchsorted(self._cdf, u, side="right")
        return (np.minimum(idx, self.hi - self.lo) + self.lo).astype(np.int64)


def fixed(n: int) -> LengthDistribution:
    """Always n tokens."""
    _check_len("fixed length", n)
    return LengthDistribution(f"fixed:{n}", n, n, np.ones(1))


def uniform(lo: int, hi: int) -> LengthDistribution:
    """Uniform over the integers [lo, hi]."""
    _check_len("uniform lo", lo)
    _check_len("uniform hi", hi)
    if hi < lo:
        raise ConfigError(f"uniform needs lo <= hi, got {lo} > {hi}")
    return LengthDistribution(f"uniform:{lo}:{hi}", lo, hi, np.ones(hi - lo + 1))


def clipped_normal(mean: float, std: float, lo: int, hi: int) -> LengthDistribution:
    """round(N(mean, std)) clipped to [lo, hi]: the tails pile up on lo and hi."""
    _check_bounds(lo, hi)
    _check_spread("normal std", std)
    if not math.isfinite(mean):
        raise ConfigError(f"normal mean must be finite, got {mean!r}")
    k = np.arange(lo, hi + 1, dtype=np.float64)
    upper = ndtr((k + 0.5 - mean) / std)
    lower = ndtr((k - 0.5 - mean) / std)
    lower[0] = 0.0  # everything below lo lands on lo
    upper[-1] = 1.0  # everything above hi lands on hi
    return LengthDistribution(f"normal:{mean:g}:{std:g}:{lo}:{hi}", lo, hi, upper - lower)


def _lognormal_pmf(mu: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    k = np.arange(lo, hi + 1, dtype=np.float64)
    edges_hi = (np.log(k + 0.5) - mu) / sigma
    edges_lo = (np.log(np.maximum(k - 0.5, 1e-300)) - mu) / sigma
    return ndtr(edges_hi) - ndtr(edges_lo)


def fit_lognormal(target_mean: float, sigma: float, lo: int = 1, hi: int = MAX_LEN) -> float:
    """The mu for which the discretised log-normal(mu, sigma) truncated to [lo, hi] has
    mean `target_mean` (bisection; the truncated mean increases with mu)."""
    _check_bounds(lo, hi)
    if not lo < target_mean < hi:
        raise ConfigError(f"target mean {target_mean!r} must lie strictly inside [{lo}, {hi}]")
    _check_spread("lognormal sigma", sigma)
    k = np.arange(lo, hi + 1, dtype=np.float64)

    def mean_at(mu: float) -> float:
        pmf = _lognormal_pmf(mu, sigma, lo, hi)
        total = pmf.sum()
        return float(np.dot(k, pmf) / total) if total > 0 else (lo if mu < 0 else hi)

    a, b = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
    for _ in range(200):
        mid = 0.5 * (a + b)
        if mean_at(mid) < target_mean:
            a = mid
        else:
            b = mid
        if b - a < 1e-12:
            break
    return 0.5 * (a + b)


def fitted_lognormal(
    target_mean: float, sigma: float, lo: int = 1, hi: int = MAX_LEN, name: str | None = None
) -> LengthDistribution:
    """A discretised, truncated log-normal whose exact mean is `target_mean`."""
    mu = fit_lognormal(target_mean, sigma, lo, hi)
    spec = name or f"lognormal:{target_mean:g}:{sigma:g}:{lo}:{hi}"
    return LengthDistribution(spec, lo, hi, _lognormal_pmf(mu, sigma, lo, hi))


def _conditional_mean(
    pmf_a: np.ndarray, lo_a: int, cdf_b: np.ndarray, lo_b: int, total: int
) -> float:
    """E[a | a + b <= total] for independent a (pmf on lo_a..) and b (cdf on lo_b..)."""
    k = np.arange(lo_a, lo_a + len(pmf_a))
    room = total - k - lo_b  # index into cdf_b of the largest b that still fits
    w = np.where(room >= 0, cdf_b[np.clip(room, 0, len(cdf_b) - 1)], 0.0)
    mass = pmf_a * w
    return float(np.dot(k, mass) / mass.sum())


@functools.lru_cache(maxsize=16)
def fit_pair(
    prompt_mean: float,
    prompt_sigma: float,
    output_mean: float,
    output_sigma: float,
    max_total: int = MAX_LEN,
    names: tuple[str, str] = ("", ""),
) -> tuple[LengthDistribution, LengthDistribution]:
    """Prompt and output log-normals (support [1, MAX_LEN]) whose means *among pairs with
    prompt + output <= max_total* are the targets.

    A trace keeps only pairs that fit the context, which shortens both means (about 3% for
    ShareGPT at 2,048); this fit moves each mu until the kept pairs have the published
    means: alternate one-dimensional bisections until both agree to 1e-6 tokens.
    """
    lo, hi = 1, MAX_LEN
    mu_p = fit_lognormal(prompt_mean, prompt_sigma, lo, hi)
    mu_o = fit_lognormal(output_mean, output_sigma, lo, hi)

    def dist(mu: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        pmf = _lognormal_pmf(mu, sigma, lo, hi)
        pmf = pmf / pmf.sum()
        return pmf, np.cumsum(pmf)

    def solve(target: float, sigma: float, other_cdf: np.ndarray) -> float:
        a, b = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
        for _ in range(100):
            mid = 0.5 * (a + b)
            if _conditional_mean(dist(mid, sigma)[0], lo, other_cdf, lo, max_total) < target:
                a = mid
            else:
                b = mid
        return 0.5 * (a + b)

    for _ in range(50):
        mu_p = solve(prompt_mean, prompt_sigma, dist(mu_o, output_sigma)[1])
        mu_o = solve(output_mean, output_sigma, dist(mu_p, prompt_sigma)[1])
        pmf_p, cdf_p = dist(mu_p, prompt_sigma)
        pmf_o, cdf_o = dist(mu_o, output_sigma)
        err_p = _conditional_mean(pmf_p, lo, cdf_o, lo, max_total) - prompt_mean
        err_o = _conditional_mean(pmf_o, lo, cdf_p, lo, max_total) - output_mean
        if abs(err_p) < 1e-6 and abs(err_o) < 1e-6:
            break
    return (
        LengthDistribution(names[0] or f"pair-input:{prompt_mean:g}", lo, hi, pmf_p),
        LengthDistribution(names[1] or f"pair-output:{output_mean:g}", lo, hi, pmf_o),
    )


def named_pair(
    dataset: str, max_total: int = MAX_LEN
) -> tuple[LengthDistribution, LengthDistribution]:
    """The (prompt, output) pair of 'sharegpt' or 'alpaca' fitted so that pairs with
    prompt + output <= max_total have the published means (see `fit_pair`)."""
    key = dataset.lower()
    if f"{key}-input" not in PUBLISHED_MEANS:
        raise ConfigError(f"unknown dataset {dataset!r}; known: sharegpt, alpaca")
    i, o = f"{key}-input", f"{key}-output"
    return fit_pair(
        PUBLISHED_MEANS[i],
        _SIGMAS[i],
        PUBLISHED_MEANS[o],
        _SIGMAS[o],
        max_total,
        (f"{i}@{max_total}", f"{o}@{max_total}"),
    )


def conditional_means(
    prompt: LengthDistribution, output: LengthDistribution, max_total: int
) -> tuple[float, float]:
    """Exact (prompt, output) means among pairs with prompt + output <= max_total."""
    return (
        _conditional_mean(prompt.pmf, prompt.lo, np.cumsum(output.pmf), output.lo, max_total),
        _conditional_mean(output.pmf, output.lo, np.cumsum(prompt.pmf), prompt.lo, max_total),
    )


def named(name: str) -> LengthDistribution:
    """One of the named distributions (see PUBLISHED_MEANS, and 'seed002')."""
    key = name.lower()
    if key in PUBLISHED_MEANS:
        return fitted_lognormal(PUBLISHED_MEANS[key], _SIGMAS[key], 1, MAX_LEN, name=key)
    if key == "seed002":
        return clipped_normal(500.0, 200.0, 200, 2048)
    known = [*PUBLISHED_MEANS, "seed002"]
    raise ConfigError(f"unknown length distribution {name!r}; known: {', '.join(known)}")


def parse_distribution(spec: str) -> LengthDistribution:
    """Build a distribution from a spec string (see the module docstring)."""
    parts = str(spec).strip().split(":")
    kind, args = parts[0].lower(), parts[1:]
    try:
        if kind == "fixed" and len(args) == 1:
            return fixed(int(args[0]))
        if kind == "uniform" and len(args) == 2:
            return uniform(int(args[0]), int(args[1]))
        if kind == "normal" and len(args) == 4:
            return clipped_normal(float(args[0]), float(args[1]), int(args[2]), int(args[3]))
        if kind == "lognormal" and len(args) == 4:
            return fitted_lognormal(float(args[0]), float(args[1]), int(args[2]), int(args[3]))
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"bad number in length distribution {spec!r}: {exc}") from None
    if not args:
        return named(kind)
    raise ConfigError(
        f"cannot parse length distribution {spec!r}; use fixed:N, uniform:LO:HI, "
        "normal:MEAN:STD:LO:HI, lognormal:MEAN:SIGMA:LO:HI or a name "
        f"({', '.join([*PUBLISHED_MEANS, 'seed002'])})"
    )


def _check_len(what: str, n: int) -> None:
    require_positive(what, n)
    if n > MAX_SUPPORT:
        raise ConfigError(f"{what} must be at most {MAX_SUPPORT:,} tokens, got {n!r:.40}")


def _check_spread(what: str, value: float) -> None:
    lo, hi = SPREAD_RANGE
    if not (isinstance(value, (int, float)) and lo <= value <= hi):
        raise ConfigError(f"{what} must be a number in [{lo:g}, {hi:g}], got {value!r}")


def _check_bounds(lo: int, hi: int) -> None:
    _check_len("lo", lo)
    _check_len("hi", hi)
    if hi < lo:
        raise ConfigError(f"need lo <= hi, got lo={lo} > hi={hi}")
