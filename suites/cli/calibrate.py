"""`kvbench calibrate gpu`: kvbench's GPU time model beside measured operator profiles.

`--profiles DIR` (laid out like Vidur's data/profiling) fits each GPU's efficiency on
some models and judges it on the others; `--judge DIR` applies the shipped fitted
profiles (`kvbench.workloads.fitted_gpu`) without refitting. The printout: the fits,
measured / datasheet / fitted time per operator group, the error distribution, the error
by num_tokens and TP, the all-reduce model against all_reduce.csv, and last the line
`held-out mean absolute error: X%` (linear layers, models not used for fitting).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Iterable

import numpy as np

from kvbench.suites.cli.argtypes import check_output_file
from kvbench.workloads.gpu_calibration import (
    TOKEN_BUCKETS,
    Calibration,
    Point,
    calibrate,
    mae,
    token_bucket,
)
from kvbench.workloads.gpu_fit import GROUPS, LINEAR_GROUPS
from kvbench.workloads.vidur import read_profiles

#: num_tokens shown in the default points table (`--all-tokens` shows every one).
SHOWN_TOKENS = (1, 16, 128, 512, 1024, 4096)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="GPU time model against measured operator profiles (Vidur layout)",
        description=(
            "kvbench calibrate gpu --profiles DIR: fit the achieved fractions of HBM "
            "bandwidth and FLOP/s (and a per-kernel floor) per GPU on some models and "
            "judge them on the others; --judge DIR: apply the shipped fitted profiles to "
            "every model in DIR without refitting. DIR holds "
            "compute/<gpu>/<org>/<model>/mlp.csv and network/<cluster>/all_reduce.csv."
        ),
    )
    p.add_argument("target", choices=("gpu",), help="what to calibrate (gpu)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--profiles", type=_folder, metavar="DIR", help="profile folder to fit and judge"
    )
    src.add_argument(
        "--judge", type=_folder, metavar="DIR", help="profile folder judged by the shipped fit"
    )
    p.add_argument(
        "--datasheet-fallback",
        action="store_true",
        help="with --judge: price a GPU with no fitted profile at its datasheet (else refused)",
    )
    p.add_argument("--all-tokens", action="store_true", help="show every num_tokens row")
    p.add_argument("--csv", metavar="PATH", help="write every priced point to PATH (CSV)")
    p.set_defaults(func=run)


def _folder(text: str) -> str:
    """An argparse type: a non-empty folder name (read_profiles checks the folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder name")
    return text


def run(args: argparse.Namespace) -> int:
    out_csv = check_output_file(args.csv, "--csv") if args.csv is not None else None
    judge = args.judge is not None
    folder = args.judge if judge else args.profiles
    data = read_profiles(folder)
    cal = calibrate(data, judge=judge, fallback=args.datasheet_fallback)
    if out_csv is not None:
        _write_csv(out_csv, cal.points)
    print(f"kvbench calibrate gpu: {cal.mode} mode, {folder} ({len(data.operators)} rows)")
    print("error = predicted / measured - 1; times in us per layer per rank; fp16 weights")
    _print_fits(cal)
    _print_points(cal, args.all_tokens)
    _print_distribution(cal)
    _print_by(cal, "num_tokens", lambda p: token_bucket(p.num_tokens), TOKEN_BUCKETS)
    tps = sorted({p.tp for p in cal.points})
    _print_by(cal, "TP", lambda p: p.tp, tps)
    _print_allreduce(cal)
    for note in cal.notes:
        print(f"note: {note}")
    print("not in this data: attention (prefill/decode kernels) and the engine's fixed step")
    print("cost; the step model keeps both as stated assumptions.")
    for gpu in sorted(cal.profiles):
        ds, fit = cal.held_out_mae(gpu, "datasheet"), cal.held_out_mae(gpu, "fitted")
        print(f"held-out MAE {gpu}: datasheet {_pct(ds)} -> fitted {_pct(fit)}")
    total = cal.held_out_mae()
    line = _pct(total) if not math.isnan(total) else "n/a (no model was held out)"
    print(f"held-out mean absolute error: {line}")
    return 0


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def _print_fits(cal: Calibration) -> None:
    print("\nfits (linear layers QKV, O, up, down):")
    print(
        f"  {'gpu':6} {'profile':10} {'judged on':28} {'HBM frac':>8} {'FLOP frac':>9} "
        f"{'floor us':>8} {'train MAE':>9} {'held-out':>8} {'datasheet':>9}"
    )
    for f in cal.fits:
        e = f.efficiency
        print(
            f"  {f.gpu:6} {cal.profiles[f.gpu].name:10} {','.join(f.judged_on) or '-':28} "
            f"{e.hbm_fraction:8.3f} {e.flops_fraction:9.3f} {e.kernel_floor_s * 1e6:8.2f} "
            f"{_pct(f.train_mae):>9} {_pct(f.test_mae):>8} {_pct(f.datasheet_mae):>9}"
        )
    for gpu, e in sorted(cal.full_fits.items()):
        prof = cal.profiles[gpu]
        print(
            f"  fit on every {gpu} model: HBM {e.hbm_fraction:.4f} x {prof.hbm_bandwidth:.4g} B/s, "
            f"FLOP/s {e.flops_fraction:.4f} x {prof.peak_flops:.4g}, floor "
            f"{e.kernel_floor_s * 1e6:.2f} us (shipped: {prof.efficiency.label}, "
            f"{prof.efficiency.hbm_fraction:.4f} / {prof.efficiency.flops_fraction:.4f} / "
            f"{prof.efficiency.kernel_floor_s * 1e6:.2f} us)"
        )


def _print_points(cal: Calibration, all_tokens: bool) -> None:
    print("\nmeasured / datasheet / fitted, us (* = held out):")
    head = " ".join(f"{g:>17}" for g in GROUPS)
    print(f"  {'gpu':5} {'model':26} {'tp':>2} {'tokens':>6} {head}")
    table: dict[tuple, dict[str, Point]] = {}
    for p in cal.points:
        if all_tokens or p.num_tokens in SHOWN_TOKENS:
            table.setdefault((p.gpu, p.model, p.tp, p.num_tokens), {})[p.group] = p
    for (gpu, model, tp, tokens), groups in sorted(table.items()):
        mark = "*" if any(p.held_out for p in groups.values()) else " "
        cells = " ".join(
            f"{groups[g].measured_s * 1e6:5.0f}/{groups[g].datasheet_s * 1e6:5.0f}/"
            f"{groups[g].fitted_s * 1e6:5.0f}"
            for g in GROUPS
        )
        print(f" {mark}{gpu:5} {model[-26:]:26} {tp:2d} {tokens:6d} {cells}")


def _quantiles(errs: list[float]) -> str:
    if not errs:
        return f"{'n/a':>23}"
    a = np.abs(np.asarray(errs)) * 100
    return f"{np.median(a):6.1f} {np.percentile(a, 90):7.1f} {a.max():7.1f}"


def _print_distribution(cal: Calibration) -> None:
    print("\n|error| % by operator group (held-out points; median p90 max), signed median:")
    print(f"  {'gpu':5} {'group':6} {'datasheet':>23} {'fitted':>23} {'fitted signed':>13}")
    for gpu in sorted(cal.profiles):
        for g in GROUPS:
            pts = [p for p in cal.points if p.gpu == gpu and p.group == g and p.held_out]
            ds = [p.error("datasheet") for p in pts]
            fit = [p.error("fitted") for p in pts]
            signed = f"{100 * np.median(fit):+12.1f}%" if fit else f"{'n/a':>13}"
            tag = "" if g in LINEAR_GROUPS else "  (not fitted: HBM fraction + floor)"
            print(f"  {gpu:5} {g:6} {_quantiles(ds)} {_quantiles(fit)} {signed}{tag}")


def _print_by(cal: Calibration, what: str, key, values: Iterable) -> None:  # type: ignore[no-untyped-def]
    values = list(values)
    print(f"\nheld-out linear-layer MAE by {what} (datasheet -> fitted):")
    print(f"  {'gpu':5} " + " ".join(f"{v!s:>15}" for v in values))
    for gpu in sorted(cal.profiles):
        cells = []
        for v in values:
            pts = [
                p for p in cal.points if p.gpu == gpu and p.linear and p.held_out and key(p) == v
            ]
            ds, fit = mae(p.error("datasheet") for p in pts), mae(p.error("fitted") for p in pts)
            cells.append(f"{_pct(ds):>6} -> {_pct(fit):>5}")
        print(f"  {gpu:5} " + " ".join(f"{c:>15}" for c in cells))


def _print_allreduce(cal: Calibration) -> None:
    print("\nall-reduce (single node; size read as bytes): ring latency + 2(n-1)/n x bytes / bw")
    for a in cal.allreduce:
        workers = ", ".join(
            f"n={n}: {_pct(d)} -> {_pct(f)}" for n, (d, f) in sorted(a.by_workers.items())
        )
        print(
            f"  {a.cluster} ({a.profile}, {a.rows} rows): datasheet "
            f"{a.datasheet_latency_s * 1e6:.0f} us + {a.datasheet_bandwidth:.3g} B/s: MAE "
            f"{_pct(a.datasheet_mae)}; fitted {a.fitted_latency_s * 1e6:.1f} us + "
            f"{a.fitted_bandwidth:.3g} B/s: MAE {_pct(a.fitted_mae)}; by workers {workers}"
            + (
                f"; {a.skipped_multinode} multi-node rows not compared"
                if a.skipped_multinode
                else ""
            )
        )


def _write_csv(path, points: list[Point]) -> None:  # type: ignore[no-untyped-def]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "gpu",
                "profile",
                "model",
                "tp",
                "num_tokens",
                "group",
                "measured_s",
                "datasheet_s",
                "fitted_s",
                "held_out",
            ]
        )
        for p in points:
            w.writerow(
                [
                    p.gpu,
                    p.profile,
                    p.model,
                    p.tp,
                    p.num_tokens,
                    p.group,
                    p.measured_s,
                    p.datasheet_s,
                    p.fitted_s,
                    p.held_out,
                ]
            )
