"""Where and with what a run is measured: device, CPU, versions, git state, and the
clock and run ids the store stamps lines with.

Imports torch lazily, and only to name the device."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import logging
import os
import platform
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds and a Z."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """A fresh, sortable run id: UTC time plus 6 random hex digits."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The git revision of `cwd` (default: this package's checkout) and whether the work
    tree has uncommitted changes. Revision None outside a repository or before the
    first commit."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parents[2]
    revision = _git(["rev-parse", "HEAD"], where)
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    dirty = bool(status) if status is not None and revision is not None else None
    return {"git_revision": revision, "git_dirty": dirty}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_environment(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where and with what a run is measured: device, CPU, versions, git state.

    Imports torch (lazily) to name the CUDA device when there is one. `extra` entries
    (e.g. a copy-bandwidth peak) are added on top.
    """
    env: dict[str, Any] = {
        "device": "cpu",
        "cuda": False,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "kvbench": _version("kvbench"),
        "time": utc_now(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["cuda"] = True
            env["device"] = torch.cuda.get_device_name(0)
            env["cuda_version"] = torch.version.cuda
        env["torch_threads"] = torch.get_num_threads()
    except Exception as exc:  # torch missing or broken: the run still records the rest
        log.warning("could not query torch for the environment: %s", exc)
    env.update(git_state())
    if extra:
        env.update(extra)
    return env
