"""The names pages and result rows give a kernel path: what actually ran, not the
`backend=` argument that chose it.

`kernels.ops` takes `backend="torch"` or `"triton"`, and "torch" on a CPU runs either
kvbench's C++ kernel reading blocks in place (`kernels.cpu_paged`, when it builds and
handles the block size) or the gather + SDPA version. Labelling both "torch" read as the
second where the first ran, so a label names the path:

    triton      the Triton kernels (a GPU, or the interpreter)
    cpu-cpp     the C++ in-place CPU kernel
    torch-sdpa  the torch version: gather the blocks, then SDPA
    torch       a row that says only "torch backend" (written before runs recorded the
                CPU path): which of the two ran is unknown

Kernel sweeps record the path as the `backend_is_triton` and `kernel_path_is_cpp` rows
(unchanged, so older result files and the gate baselines read as before); `labels_of`
turns those rows, old and new, into labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

TRITON = "triton"
CPU_CPP = "cpu-cpp"
TORCH_SDPA = "torch-sdpa"
#: The torch backend where the rows do not record which CPU path ran.
TORCH_UNKNOWN = "torch"


def kernel_label(backend: str, cpp: bool | None) -> str:
    """The label of what ran for `backend` ("torch" or "triton"; a label passes through):
    `cpp` is whether the C++ CPU kernel ran (None: not recorded)."""
    if backend != TORCH_UNKNOWN:
        return backend
    if cpp is None:
        return TORCH_UNKNOWN
    return CPU_CPP if cpp else TORCH_SDPA


def labels_of(frame: pd.DataFrame) -> list[str]:
    """The kernel paths a suite's rows name, in a stable order: a `backend` case column,
    the `backend_is_triton` rows, with the torch backend resolved by the
    `kernel_path_is_cpp` rows (both paths when both were recorded); [] when the rows name
    none."""
    out: list[str] = []
    if "backend" in frame.columns:
        out += sorted({str(b) for b in frame["backend"].dropna()})
    flags = frame[frame["metric"] == "backend_is_triton"]["value"]
    out += sorted({TRITON if v > 0 else TORCH_UNKNOWN for v in flags})
    paths = frame[frame["metric"] == "kernel_path_is_cpp"]["value"]
    if TORCH_UNKNOWN in out and not paths.empty:
        at = out.index(TORCH_UNKNOWN)
        out[at : at + 1] = sorted({kernel_label(TORCH_UNKNOWN, bool(v > 0)) for v in paths})
    return list(dict.fromkeys(out))
