"""Checks of the serving claims: the paper's sustained request-rate ratios, the
throughput claim, [PA-deep-dive]'s throughput-vs-batch table, copy-on-write savings under load,
and the calibration of the step-time model. Every figure they judge is labelled modeled
(the engine's time model) or measured (serving.measured), never mixed."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from kvbench.reports import serving as serving_tables
from kvbench.reports.claims_model import (
    FAILS,
    HOLDS,
    Verdict,
    _inside,
    _missing,
    _pct,
    _range,
    _rows,
)


def _seed001_batch(frame: pd.DataFrame) -> Verdict:
    wide = serving_tables.batch_frame(frame)
    if wide.empty or not set(serving_tables.BATCH_SYSTEMS) <= set(wide.columns):
        return _missing("run the serving.batch_table sweep")
    peaks = {s: float(wide[s].max()) for s in wide.columns}
    contiguous = wide["contiguous-max"].dropna()
    wall = int(contiguous.index.max())
    paged_x = peaks["paged"] / peaks["contiguous-max"]
    prefix_x = peaks["paged-prefix"] / peaks["contiguous-max"]
    oom = _rows(frame, "serving.batch_table", "max_batch_that_fits", setup="llama-2-70b-a100-80gb")
    fits = int(oom["value"].iloc[-1]) if not oom.empty else wall
    ok = round(paged_x, 1) == 4.2 and round(prefix_x, 1) == 6.5 and fits < 32
    return Verdict(
        f"modeled: contiguous fits {fits} requests (largest batch run {wall}), peak "
        f"{peaks['contiguous-max']:,.0f} tok/s; paged {peaks['paged']:,.0f} ({paged_x:.1f}x); "
        f"paged + prefix cache {peaks['paged-prefix']:,.0f} ({prefix_x:.1f}x)",
        HOLDS if ok else FAILS,
        "time model of one A100-80GB (312 TFLOP/s, 2.0 TB/s datasheet, priced at its fitted "
        "efficiency: `kvbench calibrate gpu`) with the seed's 35 GB of weights "
        "and 42 GB KV pool; contiguous requests reserve the 4,096-token context. Any 70B "
        "model needs 2 x 70e9 FLOPs per token, so one A100 tops out at ~2,230 tok/s however "
        "large the batch: the seed's 5,234 and 8,150 tok/s need 2.3x-3.7x its peak FLOP/s, "
        "and its own budget (42 GB / 640 MB) fits ~65 max-length requests at 2,048 tokens. "
        "Ratios judged at the seed's precision (one decimal).",
    )


def _profiles_used(rows: pd.DataFrame) -> str:
    """Which GPU calibration priced `rows` (their `calibration` parameter; runs from
    before it existed were priced at the datasheet)."""
    if "calibration" not in rows.columns or rows["calibration"].isna().all():
        return "the datasheet peaks"
    names = sorted(str(v) for v in rows["calibration"].dropna().unique())
    return "the " + " / ".join(names) + " profile (`kvbench calibrate gpu`)"


def _cow_load(
    suite_static: str, sharing: str, lo: float, hi: float
) -> Callable[[pd.DataFrame], Verdict]:
    def check(frame: pd.DataFrame) -> Verdict:
        rows = _rows(frame, "serving.cow_load", "saved_fraction", sharing=sharing)
        if rows.empty:
            return _missing("run the serving.cow_load sweep")
        note = (
            "modeled serving run: OPT-13B on A100-40GB (12 GB KV; its time model at "
            f"{_profiles_used(rows)}), Alpaca-like, Poisson "
            f"arrivals at {_range(rows['rate'], lambda v: f'{v:g}')} requests/s; time-averaged "
            "(blocks named by the sequences' tables - blocks held) / blocks named; judged on "
            "the published range"
        )
        static = _rows(frame, suite_static, "saved_fraction", workload="alpaca")
        if not static.empty:
            note += (
                f". Today's static replay ({suite_static}, Alpaca-like): {_range(static['value'])}"
            )
        by_width = ", ".join(
            f"{int(k)}: {_pct(v)}" for k, v in rows.groupby("width")["value"].mean().items()
        )
        return Verdict(
            f"{_range(rows['value'])} (by width: {by_width})",
            HOLDS if _inside(rows["value"], lo, hi, 3) else FAILS,
            note,
        )

    return check


def _calibration(frame: pd.DataFrame) -> Verdict:
    err = _rows(frame, "serving.measured", "step_error_mean")
    steps = _rows(frame, "serving.measured", "steps_timed")
    fit = _rows(frame, "serving.measured", "fit_step_error_mean")
    if err.empty or steps.empty:
        return _missing("run the serving.measured sweep")
    both = err.merge(steps[["case_key", "value"]], on="case_key", suffixes=("", "_steps"))
    held = float((both["value"] * both["value_steps"]).sum() / both["value_steps"].sum())
    worst = both.loc[both["value"].idxmax()]
    what = f"held-out mean |error| {_pct(held)} over {int(both['value_steps'].sum()):,} steps"
    if not fit.empty:
        what += f" (fit set {_pct(float(fit['value'].iloc[-1]))})"
    return Verdict(
        what,
        HOLDS if held <= 0.15 else FAILS,
        "step-time model with the CPU coefficients fitted to separate measured runs, priced "
        "on every step of the serving.measured cases (measured here); worst case "
        f"{_pct(float(worst['value']))}; bandwidth and FLOP/s bounded by the copy and FMA "
        "peaks measured in the same run; each step priced at the host speed measured beside "
        "it (its bracketing empty calls over their fit-set median; runs since the empty "
        f"calls){_constant_text(frame)}. Modeled GPU figures use coefficients fitted to "
        "measured GPU operator profiles (`kvbench calibrate gpu`), not these: this bounds "
        "the model's form, not the GPU figures' inputs.",
    )


def _constant_text(frame: pd.DataFrame) -> str:
    """The held-out error without the empty calls (the constant fit, paired on the same
    steps), step-weighted as the claim's; '' for runs before it existed."""
    err = _rows(frame, "serving.measured", "step_error_mean_constant")
    steps = _rows(frame, "serving.measured", "steps_timed")
    if err.empty or steps.empty:
        return ""
    both = err.merge(steps[["case_key", "value"]], on="case_key", suffixes=("", "_steps"))
    held = float((both["value"] * both["value_steps"]).sum() / both["value_steps"].sum())
    return f"; without them (constant fit, same steps) {_pct(held)}"


def _ratio_text(ratios: pd.DataFrame, column: str) -> str:
    return ", ".join(
        f"{setup.split('-')[0]}-{setup.split('-')[1]} {workload}: {v:.2f}x"
        for (setup, workload), v in ratios[column].dropna().items()
    )


def _rate_paper(frame: pd.DataFrame) -> Verdict:
    ratios = serving_tables.sustained_ratios(frame)
    if ratios.empty:
        return _missing("run the serving.rate sweep (sustained-rate knee cases)")
    share = ratios[ratios.index.get_level_values("workload") == "sharegpt"]
    need = {"contiguous-oracle", "contiguous-max", "static"}
    if share.empty or not need <= set(share.columns):
        return _missing("serving.rate lacks ShareGPT knee cases for paged and the baselines")
    oracle, mx, ft = share["contiguous-oracle"], share["contiguous-max"], share["static"]
    # "up to 22x" bounds the largest ratio only; what it implies below is the paper's
    # ordering: FasterTransformer sustains less than Orca (Max), so its ratio is larger
    ft_ok = bool((ft <= 22).all()) and bool((ft > mx).all())
    ok = _inside(oracle, 1.7, 2.7, 1) and _inside(mx, 2.7, 8.0, 1) and ft_ok
    measured = (
        f"modeled: Orca (Oracle) {_ratio_text(share, 'contiguous-oracle')}; "
        f"Orca (Max) {_ratio_text(share, 'contiguous-max')}; FasterTransformer-like "
        f"{_ratio_text(share, 'static')}"
    )
    return Verdict(
        measured,
        HOLDS if ok else FAILS,
        "sustained request rate (highest Poisson rate with mean normalized latency under 10 x "
        "the set-up's one-sequence decode step) of vLLM (paged) over each baseline, "
        "ShareGPT-like, on the engine's time model of the paper's GPUs at their fitted "
        "efficiency (modeled, not measured; the page's before/after table shows the datasheet "
        "figures); judged on the published ranges at their precision (one decimal). 'Up to "
        "22x' is judged as: every FasterTransformer ratio at most 22x and above the Orca "
        "(Max) ratio of its set-up (the paper's ordering). The paper's FasterTransformer has "
        "its own kernels and scheduler; here it is request-level batching over the same "
        "cache and time model.",
    )


def _throughput(frame: pd.DataFrame) -> Verdict:
    ratios = serving_tables.sustained_ratios(frame)
    if not ratios.empty and "contiguous-max" in ratios.columns:
        mx = ratios["contiguous-max"].dropna()
        ok = _inside(mx, 2.0, 4.0, 1)
        note = (
            "sustained request rate (serving.rate knee, modeled) of paged over contiguous "
            "with max reservation, same KV memory; judged on 2-4x at one decimal"
        )
        if "contiguous-oracle" in ratios.columns:
            note += f". Over the oracle reservation: {_ratio_text(ratios, 'contiguous-oracle')}"
        return Verdict(
            f"modeled: {_ratio_text(ratios, 'contiguous-max')}", HOLDS if ok else FAILS, note
        )
    rows = _rows(frame, "serving.batch", "tokens_per_second")
    if rows.empty or not {"contiguous-max", "paged"} <= set(rows["cache"]):
        return _missing("needs the scheduler sweep serving.batch (paged and contiguous)")
    parts, ratios = [], []
    for workload, sub in rows.groupby("workload"):
        paged = float(sub[sub["cache"] == "paged"]["value"].max())
        contiguous = float(sub[sub["cache"] == "contiguous-max"]["value"].max())
        ratios.append(paged / contiguous)
        parts.append(f"{workload}: {paged / contiguous:.2f}x")
    conc = _rows(frame, "serving.batch", "peak_concurrency", cache="contiguous-max")
    note = "peak modeled throughput, paged over contiguous (max reservation), same KV budget"
    if not conc.empty:
        note += f"; the contiguous cache never runs more than {int(conc['value'].max())} requests"
    ok = _inside(pd.Series(ratios, dtype=float), 2.0, 4.0, 1)
    return Verdict(
        ", ".join(parts), HOLDS if ok else FAILS, note + "; judged on 2-4x at one decimal"
    )
