"""What produced a sweep's numbers, in one short tag a reader sees at a glance.

Every sweep page, figure caption, table heading and the index's sweep table name one of

    measured here (CPU | GPU)   timed on the machine that ran the bench;
    computed here (CPU | GPU)   numerical results (logit errors, token agreement) of the
                                machine that ran the bench, nothing timed;
    counted here                exact block / slot counts from replaying requests through
                                kvbench's allocator (no clock involved);
    modeled (profile ...)       the serving engine's time model on a device profile (a GPU
                                the run did not have): numbers of the model, not a machine;
    predicted                   a cost model's prediction (the kernels' over GPU profiles;
                                serving.vllm_engine: kvbench's engine and CPU time model);
    measured on a GPU (Vidur)   operator times Vidur's profiles published, measured on GPUs
                                elsewhere (read from a file, not timed here);
    compiled here               what the compiler reports for ahead-of-time builds;
    closed form                 arithmetic on the case's parameters.

A sweep that mixes kinds (modeled rows beside measured ones) names both. Each sweep
declares its kinds where it is registered (`suites.bench.registry.sweep(produced=...)`);
the runner writes them into the results header (`bench.produced`), and the reports read
them from there. A results file written before headers carried them (schema 1 files of
November 2026 and older) is read with `LEGACY_KINDS`, the table those runs' sweeps were
known by; a sweep neither names is "not stated". Nothing is guessed from descriptions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

MEASURED = "measured here"
COMPUTED = "computed here"
COUNTED = "counted here"
MODELED = "modeled"
PREDICTED = "predicted"
PUBLISHED_GPU = "measured on a GPU (Vidur profiles)"
COMPILED = "compiled here"
CLOSED_FORM = "closed form"
NOT_STATED = "not stated"

#: Kinds whose numbers depend on the device that produced them (named beside the kind).
_ON_DEVICE = frozenset({MEASURED, COMPUTED})

#: The kinds a sweep may declare (NOT_STATED is what a reader sees when none is declared).
DECLARABLE: tuple[str, ...] = (
    MEASURED,
    COMPUTED,
    COUNTED,
    MODELED,
    PREDICTED,
    PUBLISHED_GPU,
    COMPILED,
    CLOSED_FORM,
)

#: The kinds of the sweeps of results files written before the header declared them
#: (`bench.produced`), in the order a page names them. Frozen: a new sweep declares its
#: kinds at registration and never needs an entry here.
LEGACY_KINDS: dict[str, tuple[str, ...]] = {
    "capacity.footprint": (CLOSED_FORM,),
    "capacity.concurrency": (CLOSED_FORM,),
    "capacity.prefix_formula": (CLOSED_FORM,),
    "kernel.decode": (MEASURED,),
    "kernel.prefill": (MEASURED,),
    "kernel.predicted": (PREDICTED,),
    "kernel.static": (COMPILED,),
    "peers.pool_ops": (MEASURED,),
    "peers.trace_replay": (MEASURED,),
    "peers.cpu_decode": (MEASURED,),
    "serving.batch": (COUNTED, MODELED),
    "serving.block_size": (COUNTED, MODELED),
    "serving.sharing": (COUNTED,),
    "serving.sample_preemption": (COUNTED, MODELED),
    "serving.replay": (MEASURED,),
    "serving.batch_table": (MODELED,),
    "serving.cow_load": (MODELED,),
    "serving.rate": (MODELED,),
    "serving.kv_dtype": (MODELED, CLOSED_FORM),
    "e2e.llama_fp8": (COMPUTED,),
    "e2e.kv_specs": (COMPUTED,),
    "serving.measured": (MEASURED, MODELED),
    # issue 37: vLLM's engine timed here beside kvbench's prediction of the same run
    "cow.parallel_sampling": (COUNTED,),
    "cow.beam_search": (COUNTED,),
    "prefix.scenarios": (COUNTED, CLOSED_FORM),
    "prefix.shared_prompt": (COUNTED,),
    "preempt.swap_vs_recompute": (MODELED, MEASURED),
    "utilization.static": (COUNTED, CLOSED_FORM),
    "trace.prefix_capacity": (COUNTED,),
    "trace.serving": (MODELED, MEASURED),
    # issue 27's GPU calibration: the kernel model beside Vidur's measured operator times
    "calibration.gpu": (PREDICTED, PUBLISHED_GPU),
    "kernel.decode_fp8": (MEASURED,),
    "capacity.kv_specs": (CLOSED_FORM,),
    "serving.kv_specs": (MODELED,),
}

#: What each kind means, for the page's one-line note.
MEANING: dict[str, str] = {
    MEASURED: "timed on this machine",
    COMPUTED: "numerical results (errors, token agreement) computed on this machine, nothing timed",
    COUNTED: "exact block / slot counts from replaying requests through kvbench's allocator",
    MODELED: "the serving engine's time model on a device profile, not a measurement",
    PREDICTED: "a cost model's prediction (the kernels' over GPU profiles; serving.vllm_engine: "
    "kvbench's engine and its fitted CPU time model), not a measurement",
    PUBLISHED_GPU: "operator times measured on GPUs by Vidur's authors, read from their files",
    COMPILED: "statistics of ahead-of-time compiles, no kernel run",
    CLOSED_FORM: "arithmetic on the case's parameters",
    NOT_STATED: "the sweep does not say",
}


@dataclass(frozen=True)
class Produced:
    """What produced one sweep's numbers: the kinds, the measuring device where something
    was measured, and the device profiles where something was modeled."""

    kinds: tuple[str, ...]
    device: str = ""
    profiles: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        return MEASURED in self.kinds

    def _parts(self) -> list[str]:
        parts = []
        for kind in self.kinds:
            if kind in _ON_DEVICE and self.device:
                parts.append(f"{kind} ({self.device})")
            elif kind == MODELED and self.profiles:
                parts.append(f"{kind} ({', '.join(self.profiles)})")
            else:
                parts.append(kind)
        return parts

    def only(self, kinds: tuple[str, ...]) -> Produced:
        """What produced a part of the sweep (a figure) that shows only `kinds` (of this
        sweep's kinds): the device only where it is measured, the profiles only where
        it is modeled; `kinds` () = the whole sweep. A kind the sweep lacks is an error."""
        if not kinds:
            return self
        extra = [k for k in kinds if k not in self.kinds]
        if extra:
            raise ValueError(f"kinds {extra} are not among the sweep's {list(self.kinds)}")
        return Produced(
            kinds,
            self.device if _ON_DEVICE & set(kinds) else "",
            self.profiles if MODELED in kinds else (),
        )

    def tag(self) -> str:
        """The short tag: 'measured here (CPU)', 'modeled (1xa100-40gb)', ..."""
        return " + ".join(self._parts())

    def sentence(self) -> str:
        """The tag with what each kind means, for the top of a sweep page."""
        return "Produced by: " + "; ".join(
            f"{part} — {MEANING[kind]}"
            for part, kind in zip(self._parts(), self.kinds, strict=True)
        )


def _device(frame: pd.DataFrame, env_device: str) -> str:
    triton = frame[frame["metric"] == "backend_is_triton"]["value"]
    if (not triton.empty and bool((triton > 0).all())) or env_device.startswith("cuda"):
        return "GPU"
    return "CPU"


def _profiles(frame: pd.DataFrame) -> tuple[str, ...]:
    """Device profiles the rows name: a `profile` case value (bar 'measured'), or the GPU
    part of a `setup` such as 'opt-13b-1xa100-40gb' -> '1xa100-40gb'."""
    out: list[str] = []
    if "profile" in frame.columns:
        out += [str(p) for p in frame["profile"].dropna().unique() if str(p) != "measured"]
    if "setup" in frame.columns:
        for setup in frame["setup"].dropna().unique():
            parts = str(setup).split("-")
            gpu = [i for i, p in enumerate(parts) if "x" in p and any(c.isdigit() for c in p)]
            out.append("-".join(parts[gpu[0] :]) if gpu else str(setup))
    return tuple(dict.fromkeys(sorted(out)))


def declared_kinds(headers: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Each sweep's declared kinds, read from the `bench.produced` entries of run headers
    (a run's header and its resumes, or several runs; a later header wins)."""
    out: dict[str, tuple[str, ...]] = {}
    for header in headers:
        bench = header.get("bench") if isinstance(header, Mapping) else None
        made = bench.get("produced") if isinstance(bench, Mapping) else None
        if not isinstance(made, Mapping):
            continue
        for suite, kinds in made.items():
            if isinstance(kinds, (list, tuple)) and kinds:
                out[str(suite)] = tuple(k if k in DECLARABLE else NOT_STATED for k in kinds)
    return out


def kinds_of(suite: str, declared: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The sweep's kinds: as its results header declares them, else (a results file from
    before the declaration) `LEGACY_KINDS`, else not stated."""
    if declared and suite in declared:
        return declared[suite]
    return LEGACY_KINDS.get(suite, (NOT_STATED,))


def produced(
    suite: str,
    frame: pd.DataFrame,
    declared: Mapping[str, tuple[str, ...]] | None = None,
    env_device: str = "cpu",
) -> Produced:
    """What produced `frame` (one sweep's rows), `declared` being the run headers' kinds
    (`declared_kinds`)."""
    kinds = kinds_of(suite, declared)
    return Produced(
        kinds,
        _device(frame, env_device) if _ON_DEVICE & set(kinds) else "",
        _profiles(frame) if MODELED in kinds else (),
    )
