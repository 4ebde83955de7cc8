"""Which backend runs a paged attention call, and why: the chooser over launch plans.

Backends (what runs):
    triton        the Triton kernels (`kernels.triton_ops`): compiled on CUDA, the
                  interpreter on a CPU.
    cpu_paged     kvbench's C++ CPU kernel reading blocks in place (`kernels.cpu_paged`):
                  CPU tensors, block size <= `cpu_paged.MAX_BLOCK_SIZE`, where it builds.
    torch_gather  the torch reference path (`kernels.torch_ops`): gather the blocks, then
                  SDPA; runs every valid plan, on any device.

Each answers `supports(plan) -> None | reason`, the reason naming the value that rules it
out ("block size 512 > 256 the C++ kernel is compiled for"). `choose` takes the first
backend of a stated preference order that supports the plan:

    request (`backend=`)  order tried
    None (automatic)      CUDA, or a CPU with TRITON_INTERPRET=1: triton, cpu_paged,
                          torch_gather; otherwise cpu_paged, torch_gather, triton
    "torch"               the torch side: cpu_paged, torch_gather
    "triton" / "cpu_paged" / "torch_gather"   that one only

The environment variable `KVBENCH_CPU_KERNEL` (read at call time) is a request too, for
the torch side (a "torch" request, or an automatic one that falls to the torch side):
"torch" asks for torch_gather, "cpu_paged" for the C++ kernel only. An explicit request
(the argument, or the variable) that its backend cannot run raises ConfigError listing
what every backend says; nothing falls back silently: the `Launch` names the backend and
why (the others it skipped, with their reasons), and the kernel sweeps write both into
their rows.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

from kvbench.kernels import cpu_paged, torch_ops
from kvbench.kernels.launch_plan import LaunchPlan
from kvbench.workloads.errors import ConfigError

TRITON, CPU_PAGED, TORCH_GATHER = "triton", "cpu_paged", "torch_gather"
#: Every backend, in the automatic order on CUDA.
BACKENDS: tuple[str, ...] = (TRITON, CPU_PAGED, TORCH_GATHER)
#: The torch side (a `backend="torch"` request), in its order.
TORCH_SIDE: tuple[str, ...] = (CPU_PAGED, TORCH_GATHER)
#: The environment variable that requests a torch-side backend, and what its values ask.
ENV = "KVBENCH_CPU_KERNEL"
ENV_REQUESTS: dict[str, str] = {"torch": TORCH_GATHER, "cpu_paged": CPU_PAGED}


@dataclass(frozen=True)
class Launch:
    """The backend chosen for a plan, and why.

    Attributes:
        plan: the call's launch plan.
        backend: one of `BACKENDS`.
        reason: why it runs: the request or the preference order, and every backend
            tried before it with the reason it could not run the plan.
    """

    plan: LaunchPlan
    backend: str
    reason: str


def triton_supports(plan: LaunchPlan) -> str | None:
    """None when the Triton kernels run `plan`, else why not. (Here rather than in
    `kernels.triton_ops`, which imports triton: slow, and absent on some hosts.)"""
    if plan.device not in ("cuda", "cpu", "meta"):
        return f"device {plan.device}: the Triton kernels run on CUDA, or on a CPU interpreted"
    if not _triton_installed():
        return "the triton package is not installed here"
    return None


@functools.cache
def _triton_installed() -> bool:
    """Whether triton can be imported (asked once: it is on every CUDA call's path)."""
    return importlib.util.find_spec("triton") is not None


#: Each backend's answer to "can you run this plan?".
SUPPORTS: dict[str, Callable[[LaunchPlan], str | None]] = {
    TRITON: triton_supports,
    CPU_PAGED: cpu_paged.supports,
    TORCH_GATHER: torch_ops.supports,
}


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks for the Triton interpreter (read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def env_request() -> str | None:
    """The backend `KVBENCH_CPU_KERNEL` requests (None when unset or empty); ConfigError
    naming the value when it is not one of `ENV_REQUESTS`."""
    raw = os.environ.get(ENV, "").strip().lower()
    if not raw:
        return None
    if raw not in ENV_REQUESTS:
        raise ConfigError(
            f"{ENV}={os.environ[ENV]!r} is not one of {tuple(ENV_REQUESTS)} (or unset)"
        )
    return ENV_REQUESTS[raw]


def order(device: str, requested: str | None) -> tuple[tuple[str, ...], str]:
    """(backends to try in order, why that order) for a request (None, "torch" or a
    backend name, as `validation.check_backend` accepts) on tensors of `device`."""
    if requested in BACKENDS:
        return (requested,), f"backend={requested!r} requested"
    if requested == "torch":
        return TORCH_SIDE, "backend='torch': the torch side, C++ kernel first"
    if device == "cuda":
        return BACKENDS, "automatic on cuda: Triton first"
    if device == "cpu" and interpreting():
        return BACKENDS, "automatic on cpu with TRITON_INTERPRET set: Triton first"
    side = (*TORCH_SIDE, TRITON)
    return side, f"automatic on {device}: C++ kernel first (Triton only interpreted, last)"


def choose(plan: LaunchPlan, requested: str | None) -> Launch:
    """The first backend of the request's order that supports `plan` (see the module
    docstring); ConfigError, listing what every backend says, when none does (an
    explicit request its backend cannot run)."""
    tried, why = order(plan.device, requested)
    if requested not in BACKENDS and tried[0] != TRITON:  # the torch side: the variable asks
        env = env_request()
        if env is not None:
            tried, why = (env,), f"{ENV}={os.environ[ENV]} requested"
    skipped: list[str] = []
    for name in tried:
        reason = SUPPORTS[name](plan)
        if reason is None:
            told = f"{why}; skipped {'; '.join(skipped)}" if skipped else why
            return Launch(plan, name, told)
        skipped.append(f"{name}: {reason}")
    answers = [f"{name}: {SUPPORTS[name](plan) or 'runs it'}" for name in BACKENDS]
    raise ConfigError(
        f"{why}, but it cannot run this {plan.op} ({plan.describe()}); "
        f"what each backend says: {'; '.join(answers)}"
    )
