"""fp8 KV in the modeled serving set-ups and the serving.kv_dtype sweep's cases.

Oracles: the closed-form bytes per token (2 x layers x KV heads x head dim x bytes per
element) and the set-up's quoted slot count; the time model's KV term (bytes / bandwidth).
The knee search itself is serving.rate's (tested there); here only what the dtype changes.
"""

from __future__ import annotations

import pytest

from kvbench.paged.serving.simulation import setup_spec, setup_time_model
from kvbench.suites.bench.sweeps import serving_kv_dtype
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.setups import get_setup, with_kv_dtype

OPT13B = "opt-13b-1xa100-40gb"


def test_fp8_setup_halves_bytes_per_token_and_doubles_slots() -> None:
    base = get_setup(OPT13B)
    fp8 = with_kv_dtype(base, "fp8_e4m3")
    g = base.preset.geometry
    assert base.geometry == g and base.kv_slots() == 15_728  # the paper's 15.7K, unchanged
    assert fp8.geometry.bytes_per_token == 2 * g.num_layers * g.num_kv_heads * g.head_dim * 1
    assert fp8.geometry.bytes_per_token * 2 == g.bytes_per_token
    assert fp8.kv_slots() == base.kv_bytes() // fp8.geometry.bytes_per_token == 31_457
    assert (fp8.name, fp8.kv_budget, fp8.total_weight_bytes()) == (
        base.name,
        base.kv_budget,
        base.total_weight_bytes(),
    )
    assert with_kv_dtype(base, "fp16").kv_slots() == base.kv_slots()


def test_fp8_setup_cache_and_time_model_follow_the_dtype() -> None:
    base, fp8 = get_setup(OPT13B), with_kv_dtype(get_setup(OPT13B), "fp8_e5m2")
    assert setup_spec(fp8, "paged").blocks() == 2 * setup_spec(base, "paged").blocks()
    assert setup_spec(fp8, "paged").resolved_geometry().dtype == "fp8_e5m2"
    t16, t8 = setup_time_model(base), setup_time_model(fp8)
    assert t8.geometry.dtype == "fp8_e5m2"
    # a KV-heavy decode step (64 sequences x 2,000 tokens) costs less with half the bytes
    assert t8.decode_ps(128_000, 64) < t16.decode_ps(128_000, 64)


def test_unknown_kv_dtype_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown dtype 'fp7'"):
        with_kv_dtype(get_setup(OPT13B), "fp7")


@pytest.mark.parametrize("full", [False, True])
def test_kv_dtype_cases_pair_every_system_with_both_dtypes(full: bool) -> None:
    cases = serving_kv_dtype._cases(full)
    keys = {(c["setup"], c["system"], c["kv_dtype"]) for c in cases}
    assert len(keys) == len(cases)
    for setup, system, _ in keys:
        for dtype in serving_kv_dtype.KV_DTYPES:
            assert (setup, system, dtype) in keys
    assert {c["kv_dtype"] for c in cases} == {"float16", "fp8_e4m3"}
