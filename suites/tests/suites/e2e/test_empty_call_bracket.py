"""`ModelStep.probe_every`: each step's `empty_s` is the mean of the two empty calls that
bracket it (the latest before it, the first after it), the steps' own times untouched.
The calls' and the steps' clocks are stubbed with known sequences, so a sample paired
with the wrong call (one step early or late, or an average of the wrong two) shows."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from kvbench.paged.cache import PagedKVCache
from kvbench.suites.e2e.serving_run import ModelStep, ServingModelSpec, build_model
from kvbench.workloads.errors import ConfigError

SPEC = ServingModelSpec(num_layers=1, hidden_size=32, num_q_heads=2, num_kv_heads=1,
                        intermediate_size=64, vocab_size=31, max_positions=64)  # fmt: skip


def _hook(every: int, monkeypatch: pytest.MonkeyPatch) -> ModelStep:
    cache = PagedKVCache(SPEC.geometry(), 8, 8, enable_prefix_caching=False)
    hook = ModelStep(build_model(SPEC), cache, "torch", 8, probe_every=every)
    probes = iter([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0])
    steps = iter([1.0, 2.0, 3.0, 4.0, 5.0])

    def probe() -> float:
        hook._empty.append(next(probes))
        return hook._empty[-1]

    monkeypatch.setattr(hook, "_probe", probe)
    monkeypatch.setattr(hook, "_timed", lambda batch: next(steps))
    monkeypatch.setattr(hook.attention, "make_plan", lambda batch: None)
    return hook


def _run(hook: ModelStep, steps: int) -> None:
    for i in range(steps):
        hook(i, [("a", i)], [], 0)


@pytest.mark.parametrize(
    ("every", "want"),
    [
        (1, [15.0, 25.0, 35.0, 45.0, 55.0]),  # calls 10 | 20 | 30 | 40 | 50 | 60
        (2, [15.0, 15.0, 25.0, 25.0, 30.0]),  # calls 10 | | 20 | | 30 | (5th: 30 alone)
        (3, [15.0, 15.0, 15.0, 20.0, 20.0]),  # calls 10 | | | 20 | (4th, 5th: 20 alone)
    ],
)
def test_each_step_gets_the_mean_of_its_bracketing_calls(
    every: int, want: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook(every, monkeypatch)
    _run(hook, 5)
    assert [s.empty_s for s in hook.samples] == want
    assert [s.measured_s for s in hook.samples] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_no_empty_calls_by_default_and_a_negative_period_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = _hook(0, monkeypatch)
    _run(hook, 3)
    assert [s.empty_s for s in hook.samples] == [0.0, 0.0, 0.0]
    assert hook._empty == []
    cache = PagedKVCache(SPEC.geometry(), 8, 8, enable_prefix_caching=False)
    with pytest.raises(ConfigError, match="probe_every must be >= 0, got -1"):
        ModelStep(build_model(SPEC), cache, "torch", 8, probe_every=-1)
