"""Find host reads of tensor values: the calls that make a CUDA stream synchronize.

A paged kernel call on CUDA tensors should only enqueue work. Any read of a tensor's
values on the host (`.item()`, `int(t)`, `bool(t)`, `.tolist()`, `.cpu()`,
`.to("cpu")`, `.numpy()`) or any op whose output size depends on values (`nonzero`,
`unique`, `masked_select`, indexing with a boolean mask) waits for the GPU to catch up;
inside a timed region it adds host time between the timer's events.

`HostReadRecorder` is a `TorchFunctionMode` that records those calls, so the check runs on
a CPU, where they cost nothing and would go unnoticed: drive a call with the Triton
launch stubbed, and assert that `recorder.reads` is empty. A transfer to the CPU is
counted when it is named explicitly (`.cpu()`, `.to("cpu")`) or crosses devices;
`.to(t.device)` is not (on a CPU it cannot be told from a no-op), so code on a hot path
names the host only where it means it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor

#: Methods that read values on the host, whatever their arguments.
VALUE_READS: dict[Callable[..., Any], str] = {
    _T.item: "item()",
    _T.tolist: "tolist()",
    _T.__bool__: "bool()",
    _T.__int__: "int()",
    _T.__float__: "float()",
    _T.__index__: "index()",
    _T.numpy: "numpy()",
    _T.cpu: "cpu()",
}
#: Ops whose output shape depends on tensor values (a hidden device-to-host read).
DATA_DEPENDENT: dict[Callable[..., Any], str] = {
    torch.nonzero: "nonzero",
    _T.nonzero: "nonzero",
    torch.unique: "unique",
    _T.unique: "unique",
    torch.masked_select: "masked_select",
    _T.masked_select: "masked_select",
    torch.argwhere: "argwhere",
}


def _names_cpu(value: object) -> bool:
    if isinstance(value, str):
        return torch.device(value).type == "cpu"
    return isinstance(value, torch.device) and value.type == "cpu"


@dataclass(frozen=True)
class HostRead:
    """One recorded call: what it was (e.g. "item()", "to(cpu)")."""

    what: str


class HostReadRecorder(TorchFunctionMode):
    """Records host reads made while it is active (`with HostReadRecorder() as rec:`).

    Counted: the calls of `VALUE_READS` and `DATA_DEPENDENT`, indexing with a boolean
    mask, and `.to(...)` that names the CPU as a string or whose result is on another
    device than its input.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[HostRead] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        what = VALUE_READS.get(func) or DATA_DEPENDENT.get(func)
        if what is None and func is _T.__getitem__ and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                what = "boolean-mask index"
        result = func(*args, **kwargs)
        if what is None and func is _T.to and isinstance(result, torch.Tensor):
            targets = (*args[1:], kwargs.get("device"))
            named = any(isinstance(t, str) and _names_cpu(t) for t in targets)
            if named or (result.device.type == "cpu" and args[0].device.type != "cpu"):
                what = "to(cpu)"
        if what is not None:
            self.reads.append(HostRead(what))
        return result

    def summary(self) -> list[str]:
        """What was recorded, in call order."""
        return [r.what for r in self.reads]
