"""The gate's timing cases are fair comparisons: in a `*_vs_baseline` case both sides make
the same call (this tree's `kernels.torch_ops` against the baseline's frozen copy, same
arguments, no argument checking on either side), so unchanged code gives a ratio of 1.0
on any machine. Checked by recording the calls, not by timing anything.

(The candidate once went through `kernels.ops`, whose argument checks are a fixed
Python cost per call: identical code measured 1.10 on one machine and 1.23 on another,
and failed the gate in CI.)
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kvbench.kernels import torch_ops
from kvbench.kernels import validation as val
from kvbench.suites.gate import timing

CASES = {
    "paged_decode_vs_baseline": (timing.decode_vs_baseline, (64,), "paged_decode_attention"),
    "paged_prefill_vs_baseline": (timing.prefill_vs_baseline, (32, 16), "paged_prefill_attention"),
}


class Recorder:
    """Stands in for one kernel function: records each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return args[-2]  # the `out` tensor, as the real kernels return it


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_sides_make_the_same_call(name, monkeypatch):
    make, args, fn_name = CASES[name]
    ours, frozen_fn = Recorder(), Recorder()
    monkeypatch.setattr(torch_ops, fn_name, ours)
    frozen = ModuleType("frozen_stub")
    setattr(frozen, fn_name, frozen_fn)

    case = make(*args)
    assert case.name == name
    candidate, reference = case.build(torch.device("cpu"), frozen)

    checks = []
    for check in ("check_decode", "check_prefill", "check_scale"):
        real = getattr(val, check)

        def counting(*a, _real=real, **kw):
            checks.append(a)
            return _real(*a, **kw)

        monkeypatch.setattr(val, check, counting)
    candidate()
    reference()
    assert checks == [], "a side of the ratio validates its arguments on every call"
    assert len(ours.calls) == 1 and len(frozen_fn.calls) == 1
    (mine,), (theirs,) = ours.calls, frozen_fn.calls
    assert len(mine) == len(theirs)
    out_pos = len(mine) - 2
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if i == out_pos:  # each side writes its own output buffer
            assert a is not b and a.shape == b.shape
        else:
            assert _same(a, b), f"argument {i} differs between candidate and reference"


def test_frozen_copy_of_this_tree_computes_the_same_output():
    """With the baseline frozen from this very tree, both sides give identical outputs."""
    frozen = timing.load_frozen(timing.frozen_source(), "this tree's torch_ops")
    candidate, reference = timing.decode_vs_baseline(64).build(torch.device("cpu"), frozen)
    torch.testing.assert_close(candidate(), reference(), rtol=0, atol=0)
