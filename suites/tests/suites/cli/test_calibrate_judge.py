"""`kvbench calibrate gpu --judge DIR` on models the shipped fit never saw.

The unseen models are real Vidur measurements copied from shared/data/vidur under a new
organisation and name, with every operator time scaled by a known factor. The oracle is
arithmetic, independent of the fit: the prediction depends on the geometry only, so
scaling the measured times by s turns each point's error e into (1 + e) / s - 1, and the
judged mean absolute error of the perturbed copy follows from the unperturbed one.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest

from kvbench.suites.cli import main

SHARED = Path(__file__).resolve().parents[5] / "shared" / "data" / "vidur"
SOURCE = SHARED / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"

pytestmark = pytest.mark.skipif(not SOURCE.is_file(), reason="shared/data/vidur not here")


def _copy_scaled(root: Path, gpu: str, org: str, name: str, scale: float) -> Path:
    """Copy SOURCE to root/compute/<gpu>/<org>/<name>/mlp.csv with every time_stats cell
    multiplied by `scale` (geometry, num_tokens and TP columns untouched)."""
    dest = root / "compute" / gpu / org / name / "mlp.csv"
    dest.parent.mkdir(parents=True)
    if scale == 1.0:
        shutil.copyfile(SOURCE, dest)
        return dest
    with open(SOURCE, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    timed = [i for i, h in enumerate(rows[0]) if h.startswith("time_stats.")]
    for row in rows[1:]:
        for i in timed:
            if row[i]:
                row[i] = repr(float(row[i]) * scale)
    with open(dest, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    return dest


def _judge(folder: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list]:
    """Run the CLI's judge mode; return its stdout and the --csv points."""
    assert main(["calibrate", "gpu", "--judge", str(folder), "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    with open(out, newline="", encoding="utf-8") as fh:
        return text, list(csv.DictReader(fh))


def _held_out_line(text: str) -> float:
    last = text.rstrip().splitlines()[-1]
    m = re.fullmatch(r"held-out mean absolute error: (\d+\.\d)%", last)
    assert m, last
    return float(m.group(1)) / 100


def _linear_errors(points: list[dict], model: str) -> list[float]:
    groups = {"qkv", "o", "up", "down"}
    return [
        float(p["fitted_s"]) / float(p["measured_s"]) - 1
        for p in points
        if p["model"] == model and p["group"] in groups
    ]


def test_judge_prices_a_renamed_copy_and_a_perturbed_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verbatim copy under a new name and one with every time x1.25: every point is
    held out (neither name was fitted), no refit happens (the shipped a100-80gb fit
    prices both), and the error line matches the arithmetic oracle."""
    plain, slow = tmp_path / "plain", tmp_path / "slow"
    _copy_scaled(plain, "a100", "acme", "clone-7b", 1.0)
    _copy_scaled(slow, "a100", "acme", "clone-7b-slow", 1.25)

    text, pts = _judge(plain, tmp_path / "plain.csv", capsys)
    assert "judge mode" in text.splitlines()[0]
    assert pts and all(p["held_out"] == "True" for p in pts)
    assert {p["profile"] for p in pts} == {"a100-80gb"}
    errs = _linear_errors(pts, "acme/clone-7b")
    rows = len(SOURCE.read_text(encoding="utf-8").splitlines()) - 1
    assert len(errs) == 4 * rows  # every measured row priced, the four linear groups each
    mae_plain = sum(abs(e) for e in errs) / len(errs)
    assert _held_out_line(text) == pytest.approx(mae_plain, abs=0.0005)
    assert mae_plain <= 0.10  # the shipped fit, judged on measurements it fitted (in-sample)

    text_s, pts_s = _judge(slow, tmp_path / "slow.csv", capsys)
    assert len(pts_s) == len(pts)
    for p, twin in zip(pts_s, pts, strict=True):  # same rows in the same order
        assert (p["tp"], p["num_tokens"], p["group"]) == (
            twin["tp"],
            twin["num_tokens"],
            twin["group"],
        )
        assert float(p["fitted_s"]) == pytest.approx(float(twin["fitted_s"]), rel=1e-12)
        assert float(p["measured_s"]) == pytest.approx(1.25 * float(twin["measured_s"]), rel=1e-9)
    expected = sum(abs((1 + e) / 1.25 - 1) for e in errs) / len(errs)
    assert _held_out_line(text_s) == pytest.approx(expected, abs=0.0005)
    assert _held_out_line(text_s) > 0.10  # a 25% slower GPU is not hidden by the fit


def test_judge_covers_every_gpu_and_model_in_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two GPUs and two unseen names in one folder: each priced by its own GPU's fit,
    a per-GPU held-out line each, and the last line over all of them."""
    _copy_scaled(tmp_path / "d", "a100", "acme", "m1", 1.0)
    _copy_scaled(tmp_path / "d", "h100", "acme", "m2", 0.8)
    text, pts = _judge(tmp_path / "d", tmp_path / "d.csv", capsys)
    assert {(p["gpu"], p["profile"], p["model"]) for p in pts} == {
        ("a100", "a100-80gb", "acme/m1"),
        ("h100", "h100", "acme/m2"),
    }
    assert re.search(r"held-out MAE a100: datasheet [\d.]+% -> fitted [\d.]+%", text)
    assert re.search(r"held-out MAE h100: datasheet [\d.]+% -> fitted [\d.]+%", text)
    errs = _linear_errors(pts, "acme/m1") + _linear_errors(pts, "acme/m2")
    assert _held_out_line(text) == pytest.approx(sum(abs(e) for e in errs) / len(errs), abs=0.0005)
