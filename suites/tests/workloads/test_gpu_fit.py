"""The GPU efficiency fit and the judge: known coefficients recovered from data generated
by the model, shipped fits applied to a model they never saw, unknown GPUs refused, and
the shipped values reproduced from the shared data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvbench.workloads.efficiency import Efficiency
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.fitted_gpu import FITTED
from kvbench.workloads.gpu_calibration import calibrate
from kvbench.workloads.gpu_fit import (
    fit_efficiency,
    kernel_seconds,
    operator_work,
    roofline_seconds,
)
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.vidur import read_profiles

from .vidur_tree import LLAMA_7B, LLAMA_70B, QWEN_14B, write_allreduce, write_model

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data" / "vidur"
TRUE = Efficiency(0.78, 0.62, 4.5e-6)


def test_work_of_a_linear_layer_is_its_gemm() -> None:
    w = operator_work(LLAMA_70B, 8, 3, "attn_pre_proj")
    k, n = 8192, (64 // 8 + 2 * 1) * 128
    assert (w.nbytes, w.flops) == (2 * (k * n + 3 * k + 3 * n), 2.0 * 3 * k * n)
    assert w.tiled_flops == 2.0 * 64 * k * n
    up = operator_work(LLAMA_7B, 2, 64, "mlp_up_proj")
    assert up.flops == 2.0 * 64 * 4096 * 11008  # gated: 2 x F / tp columns
    with pytest.raises(ConfigError, match="'softmax'"):
        operator_work(LLAMA_7B, 1, 1, "softmax")


def test_datasheet_roofline_is_bytes_or_flops_over_peak() -> None:
    h100 = get_profile("h100").datasheet()
    w = operator_work(LLAMA_7B, 1, 1, "mlp_down_proj")
    assert roofline_seconds(w, h100) == pytest.approx(w.nbytes / 3.35e12)
    big = operator_work(LLAMA_7B, 1, 4096, "mlp_down_proj")
    assert roofline_seconds(big, h100) == pytest.approx(big.flops / 989e12)


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_fit_recovers_known_coefficients(tmp_path: Path, noise: float) -> None:
    prof = get_profile("a100-80gb").datasheet()
    for name, shape in (("m7", LLAMA_7B), ("m70", LLAMA_70B)):
        write_model(tmp_path, "a100", f"org/{name}", shape, prof, TRUE, noise)
    got = fit_efficiency(read_profiles(tmp_path).operators, prof)
    tol = 2e-3 if noise == 0 else 0.04
    assert got.hbm_fraction == pytest.approx(TRUE.hbm_fraction, rel=tol)
    assert got.flops_fraction == pytest.approx(TRUE.flops_fraction, rel=tol)
    assert got.kernel_floor_s == pytest.approx(TRUE.kernel_floor_s, rel=10 * tol)
    assert got.fitted_on == ("org/m7", "org/m70") and got.label == "fitted"


def test_fit_mode_holds_each_model_out_and_judges_it(tmp_path: Path) -> None:
    prof = get_profile("h100").datasheet()
    write_model(tmp_path, "h100", "org/a", LLAMA_7B, prof, TRUE, 0.02)
    write_model(tmp_path, "h100", "org/b", LLAMA_70B, prof, TRUE, 0.02)
    write_allreduce(tmp_path, "h100_dgx")
    cal = calibrate(read_profiles(tmp_path))
    assert [f.judged_on for f in cal.fits] == [("org/a",), ("org/b",)]
    assert all(p.held_out for p in cal.points)
    assert cal.held_out_mae() < 0.03 < 0.3 < cal.held_out_mae(which="datasheet")
    (ar,) = cal.allreduce
    assert ar.fitted_latency_s == pytest.approx(20e-6, rel=0.05)
    assert ar.fitted_bandwidth == pytest.approx(200e9, rel=0.05)


def test_judge_applies_the_shipped_fit_to_an_unseen_model(tmp_path: Path) -> None:
    """An unseen shape on an H100 that behaves as the shipped fit says: every point held
    out, fitted error ~0; Llama-2-70B (used by the fit) is priced but not held out."""
    prof = get_profile("h100")
    assert prof.calibration == "fitted"
    write_model(tmp_path, "h100", "qwen/q14", QWEN_14B, prof.datasheet(), prof.efficiency)
    write_model(tmp_path, "h100", "meta-llama/Llama-2-70b-hf", LLAMA_70B, prof.datasheet(), TRUE)
    cal = calibrate(read_profiles(tmp_path), judge=True)
    held = {p.model for p in cal.points if p.held_out}
    assert held == {"qwen/q14"}
    assert cal.held_out_mae() < 1e-6
    assert any("not held out" in n for n in cal.notes)


def test_judge_refuses_a_gpu_without_a_fitted_profile(tmp_path: Path) -> None:
    """'cpu' has a datasheet profile and no fit: refused by name, or priced at the
    datasheet with --datasheet-fallback (stated); a GPU kvbench has no profile for is
    refused either way; h200 carries h100's fit, transferred, and says so."""
    cpu = get_profile("cpu")
    write_model(tmp_path, "cpu", "org/a", LLAMA_7B, cpu, TRUE)
    with pytest.raises(ConfigError, match=r"GPU 'cpu' .* has no fitted profile"):
        calibrate(read_profiles(tmp_path), judge=True)
    cal = calibrate(read_profiles(tmp_path), judge=True, fallback=True)
    assert any("priced at the datasheet" in n for n in cal.notes)
    for p in cal.points:
        if p.group == "qkv":
            work = operator_work(LLAMA_7B, p.tp, p.num_tokens, "attn_pre_proj")
            assert p.fitted_s == pytest.approx(kernel_seconds(work, cpu, Efficiency()))
    write_model(tmp_path, "l40s", "org/a", LLAMA_7B, cpu, TRUE)
    with pytest.raises(ConfigError, match="GPU 'l40s'"):
        calibrate(read_profiles(tmp_path), judge=True, fallback=True)
    other = tmp_path / "h200"
    write_model(other, "h200", "org/a", LLAMA_7B, get_profile("h200").datasheet(), TRUE)
    cal = calibrate(read_profiles(other), judge=True)
    assert any("h100's fit (transferred)" in n for n in cal.notes)
    assert get_profile("h200").calibration == "fitted:h100"


def test_efficiency_refuses_unphysical_values() -> None:
    for bad in ({"hbm_fraction": 1.2}, {"flops_fraction": 0.0}, {"kernel_floor_s": -1e-6}):
        with pytest.raises(ConfigError):
            Efficiency(**bad)
    assert math.isclose(
        get_profile("h100").effective_hbm_bandwidth, 3.35e12 * FITTED["h100"].hbm_fraction
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data/vidur not in this checkout")
def test_shipped_fits_are_reproduced_and_meet_the_held_out_goal() -> None:
    cal = calibrate(read_profiles(SHARED))
    for gpu, name in (("a100", "a100-80gb"), ("h100", "h100")):
        refit, shipped = cal.full_fits[gpu], FITTED[name]
        assert refit.hbm_fraction == pytest.approx(shipped.hbm_fraction, abs=1e-3)
        assert refit.flops_fraction == pytest.approx(shipped.flops_fraction, abs=1e-3)
        assert refit.kernel_floor_s == pytest.approx(shipped.kernel_floor_s, abs=0.05e-6)
        assert cal.held_out_mae(gpu) <= 0.10 < cal.held_out_mae(gpu, "datasheet")


def test_the_step_model_prices_at_the_fitted_profile() -> None:
    """Weights read at the fitted HBM fraction, dense FLOPs at the fitted FLOP fraction,
    and 4 kernel floors per layer on top of the fixed step; 'datasheet' undoes all."""
    from kvbench.paged.serving.simulation import setup_time_model
    from kvbench.workloads.setups import get_setup, with_calibration

    setup = get_setup("llama-2-70b-a100-80gb")
    eff = FITTED["a100-80gb"]
    fitted = setup_time_model(setup)
    sheet = setup_time_model(with_calibration(setup, "datasheet"))
    assert sheet.profile.calibration == "datasheet" and fitted.profile.calibration == "fitted"
    assert fitted.weight_ps == pytest.approx(sheet.weight_ps / eff.hbm_fraction, rel=1e-9)
    assert fitted.dense_ps_per_token == pytest.approx(
        sheet.dense_ps_per_token / eff.flops_fraction, rel=1e-6
    )
    layers = setup.preset.geometry.num_layers
    assert fitted.fixed_ps - sheet.fixed_ps == round(4 * layers * eff.kernel_floor_s * 1e12)
    assert fitted.decode_ps(1000, 8) > sheet.decode_ps(1000, 8)
    with pytest.raises(ConfigError, match="'measured'"):
        with_calibration(setup, "measured")
