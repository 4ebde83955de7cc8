"""The gate on real compiled kernels (sm_90 cubins from `kernels.aot`, no GPU needed).

* Unchanged code passes: a fresh compile of a decode configuration reproduces the cached
  record exactly, and the gate passes it.
* A heavier kernel fails: the real decode kernel rebuilt with every K tile loaded twice
  (`gate_variants.heavier_decode`) makes the gate fail, naming `paged_decode` and the
  metrics that grew (SASS instructions, shared memory), and nothing else.

One configuration (float16, head dim 128, GQA 4, split-KV), compiled three times: about
20-40 s on 2 cores. The two tested compiles run in a fresh compile-mode process
(`aot.compile_isolated`: the conformance session interprets Triton, which breaks code
generation in its own process) with an empty Triton cache of their own, so they are real
compiles on any machine, not hits in a cache an earlier run left behind.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from kvbench.suites import gate

aot = pytest.importorskip("kvbench.kernels.aot")
configs = pytest.importorskip("kvbench.kernels.configs")
triton_kernels = pytest.importorskip("kvbench.kernels.triton_kernels")

from kvbench.suites.gate.static import to_static  # noqa: E402

from .variants import heavier_decode  # noqa: E402

ARCH = 90


@pytest.fixture(scope="module")
def decode_cfg():
    return configs.decode_config(torch.float16, 128, 4, single=False)


@pytest.fixture(scope="module")
def baseline(decode_cfg, tmp_path_factory):
    """A real sm_90 baseline of the decode configuration (through the AOT cache)."""
    records = [to_static(r) for r in aot.compile_all([decode_cfg], archs=[ARCH], workers=1)]
    cand = gate.Candidate(
        run_id="baseline-run",
        environment={"triton": aot_triton()},
        triton_version=aot_triton(),
        static=records,
        conformance=[{"label": "check=paged_decode", "case": {}, "passed": True}],
        source_hash=aot.source_hash(),
    )
    doc = gate.make_baseline(cand, "sm_90", "2026-01-01T00:00:00Z")
    path = gate.write_baseline(doc, tmp_path_factory.mktemp("gate") / "sm90.json")
    return gate.load_baseline(path)


def aot_triton() -> str:
    import triton

    return triton.__version__


def candidate(records):
    return gate.Candidate(
        run_id="candidate-run",
        environment={},
        triton_version=aot_triton(),
        static=[to_static(r) for r in records],
        conformance=[{"label": "check=paged_decode", "case": {}, "passed": True}],
    )


@pytest.fixture
def empty_triton_cache(tmp_path, monkeypatch):
    """A Triton cache of this test's own for the compile process (it inherits the
    environment): nothing compiled before can be reused."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


def test_unchanged_kernel_recompiled_passes(baseline, decode_cfg, empty_triton_cache):
    fresh = aot.compile_isolated(decode_cfg, ARCH)  # no cache: a real second compile
    assert fresh.spills == 0
    result = gate.evaluate([baseline], candidate([fresh]))
    assert result.exit_code == 0, gate.format_table(result, show_all=True)
    assert {r.verdict for r in result.rows} == {gate.GateVerdict.PASS}


def test_decode_kernel_loading_k_twice_fails(baseline, decode_cfg, tmp_path, empty_triton_cache):
    heavy = aot.compile_isolated(decode_cfg, ARCH, partial(heavier_decode, tmp_path))
    result = gate.evaluate([baseline], candidate([heavy]))
    table = gate.format_table(result)
    assert result.exit_code == 1, table
    failing = {(r.subject.split("[")[0], r.metric) for r in result.failures}
    assert failing, table
    assert {k for k, _ in failing} == {"paged_decode"}
    assert ("paged_decode", "sass_instructions") in failing or (
        "paged_decode",
        "shared_bytes",
    ) in failing, table
    for kernel, metric in failing:
        assert any(kernel in line and metric in line for line in table.splitlines())


def test_compile_one_refuses_an_interpreting_process(decode_cfg, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(aot.CompileCheckError, match=r"TRITON_INTERPRET='1'.*compile_isolated"):
        aot.compile_one(decode_cfg, ARCH)
