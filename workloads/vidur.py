"""Reader of measured GPU operator profiles laid out like Vidur's `data/profiling`.

The layout (any GPU, organisation and model names; Vidur's data is MIT-licensed):

    ROOT/compute/<gpu>/<org>/<model>/mlp.csv      per-layer operator times
    ROOT/network/<cluster>/all_reduce.csv         all-reduce times

`mlp.csv` has one row per (num_tokens, num_tensor_parallel_workers) with the model's
geometry (`n_head`, `n_kv_head`, `n_embd`, `n_expanded_embd`, `use_gated_mlp`) and
`time_stats.<op>.median` in milliseconds per layer for the operators in `COMPUTE_OPS`.
`all_reduce.csv` has `time_stats.all_reduce.median` (ms), `num_workers`,
`devices_per_node` and `size` (bytes of the reduced buffer: an assumption, see
`AllReduceRow`).

Pure data: nothing here knows a device or a time model. Every malformed file is refused
with a `ConfigError` naming the file, the line (1 = the header) and the column; reading
changes nothing.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.workloads.errors import ConfigError

#: Operators whose median time `mlp.csv` must carry (linear layers, then elementwise).
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
COMPUTE_OPS = LINEAR_OPS + ELEMENTWISE_OPS

_GEOMETRY = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")
_COMPUTE_COLUMNS = (
    *_GEOMETRY,
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
    *(f"time_stats.{op}.median" for op in COMPUTE_OPS),
)
_ALLREDUCE_COLUMNS = ("time_stats.all_reduce.median", "num_workers", "devices_per_node", "size")


@dataclass(frozen=True)
class ModelShape:
    """A transformer layer's geometry as profiled (whole model, before tensor parallelism).

    Attributes:
        n_head, n_kv_head: query and key/value heads.
        n_embd: model width (hidden size).
        n_expanded_embd: MLP inner width.
        gated_mlp: the up projection computes gate and up together (2 x n_expanded_embd).
    """

    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    gated_mlp: bool

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class OperatorRow:
    """One measured (gpu, model, tp, num_tokens) point: median ms per layer of each op."""

    gpu: str
    model: str
    tp: int
    num_tokens: int
    shape: ModelShape
    median_ms: dict[str, float]
    source: str


@dataclass(frozen=True)
class AllReduceRow:
    """One measured all-reduce: `size_bytes` reduced over `num_workers` ranks.

    Vidur's `size` column is read as bytes: the bus bandwidth it then implies (2 (n-1)/n
    x size / time) stays under the NVLink figures, which read as fp16 elements it would
    exceed on A100."""

    cluster: str
    num_workers: int
    devices_per_node: int
    size_bytes: float
    median_ms: float
    source: str


@dataclass(frozen=True)
class VidurProfiles:
    """Everything read from one profile directory."""

    root: str
    operators: tuple[OperatorRow, ...]
    allreduce: tuple[AllReduceRow, ...]

    def gpus(self) -> list[str]:
        return sorted({r.gpu for r in self.operators})

    def models(self, gpu: str) -> list[str]:
        return sorted({r.model for r in self.operators if r.gpu == gpu})


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file with every `required` column; refuses a file that
    is not UTF-8, an empty file, a missing column and a short row, naming the file (and
    line)."""
    try:
        yield from _utf8_rows(path, required)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start} "
            "of a read block)"
        ) from None


def _utf8_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ConfigError(f"{path}: empty file (no header line)") from None
        except csv.Error as exc:
            raise ConfigError(f"{path}: line 1: not CSV ({exc})") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise ConfigError(f"{path}: line 1: missing column {missing[0]!r}")
        index = {c: header.index(c) for c in required}
        any_row = False
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise ConfigError(
                        f"{path}: line {line}: {len(row)} fields, the header has {len(header)}"
                    )
                any_row = True
                yield line, {c: row[i] for c, i in index.items()}
        except csv.Error as exc:
            raise ConfigError(f"{path}: line {reader.line_num}: not CSV ({exc})") from None
        if not any_row:
            raise ConfigError(f"{path}: no data rows after the header")


#: Largest number a cell may hold (any column): far above any real geometry, token count,
#: byte size or millisecond time, far below where sums and products overflow.
MAX_CELL = 1e15


def _number(path: Path, line: int, column: str, text: str, *, positive: bool = True) -> float:
    """The finite number in a cell (> 0 when `positive`, else >= 0; at most `MAX_CELL`),
    or a ConfigError naming file, line and column."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{path}: line {line}: column {column!r}: {text!r} is not a number"
        ) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise ConfigError(f"{path}: line {line}: column {column!r}: {text!r} must be finite {need}")
    if value > MAX_CELL:
        raise ConfigError(
            f"{path}: line {line}: column {column!r}: {text!r} is above {MAX_CELL:.0e}"
        )
    return value


def _integer(path: Path, line: int, column: str, text: str) -> int:
    value = _number(path, line, column, text)
    if value != int(value):
        raise ConfigError(f"{path}: line {line}: column {column!r}: {text!r} is not an integer")
    return int(value)


def _boolean(path: Path, line: int, column: str, text: str) -> bool:
    word = text.strip().lower()
    if word in ("true", "1"):
        return True
    if word in ("false", "0"):
        return False
    raise ConfigError(f"{path}: line {line}: column {column!r}: {text!r} is not true/false")


def read_mlp_csv(path: Path, gpu: str, model: str) -> list[OperatorRow]:
    """The rows of one `mlp.csv` (see module docstring)."""
    out = []
    for line, row in _rows(path, _COMPUTE_COLUMNS):
        geo = {c: _integer(path, line, c, row[c]) for c in _GEOMETRY}
        shape = ModelShape(
            geo["n_head"],
            geo["n_kv_head"],
            geo["n_embd"],
            geo["n_expanded_embd"],
            _boolean(path, line, "use_gated_mlp", row["use_gated_mlp"]),
        )
        if shape.n_embd % shape.n_head or shape.n_head % shape.n_kv_head:
            raise ConfigError(
                f"{path}: line {line}: column 'n_head': n_embd {shape.n_embd}, n_head "
                f"{shape.n_head}, n_kv_head {shape.n_kv_head} do not divide"
            )
        tp = _integer(path, line, "num_tensor_parallel_workers", row["num_tensor_parallel_workers"])
        medians = {
            op: _number(path, line, f"time_stats.{op}.median", row[f"time_stats.{op}.median"])
            for op in COMPUTE_OPS
        }
        out.append(
            OperatorRow(
                gpu,
                model,
                tp,
                _integer(path, line, "num_tokens", row["num_tokens"]),
                shape,
                medians,
                str(path),
            )
        )
    return out


def read_allreduce_csv(path: Path, cluster: str) -> list[AllReduceRow]:
    """The rows of one `all_reduce.csv` (see module docstring)."""
    out = []
    for line, row in _rows(path, _ALLREDUCE_COLUMNS):
        out.append(
            AllReduceRow(
                cluster,
                _integer(path, line, "num_workers", row["num_workers"]),
                _integer(path, line, "devices_per_node", row["devices_per_node"]),
                _number(path, line, "size", row["size"]),
                _number(
                    path, line, "time_stats.all_reduce.median", row["time_stats.all_reduce.median"]
                ),
                str(path),
            )
        )
    return out


def read_profiles(root: str | Path) -> VidurProfiles:
    """Every `compute/*/*/*/mlp.csv` and `network/*/all_reduce.csv` under `root`.

    Refuses a root that is not a folder or holds no `mlp.csv`; the network part is
    optional (an empty tuple when absent)."""
    base = Path(root)
    if not base.exists():
        raise ConfigError(f"profile folder {str(root)!r} does not exist")
    if not base.is_dir():
        raise ConfigError(f"profile folder {str(root)!r} is not a folder")
    operators: list[OperatorRow] = []
    for path in sorted(base.glob("compute/*/*/*/mlp.csv")):
        gpu, org, model = path.parts[-4:-1]
        operators.extend(read_mlp_csv(path, gpu, f"{org}/{model}"))
    if not operators:
        raise ConfigError(
            f"profile folder {str(root)!r} holds no compute/<gpu>/<org>/<model>/mlp.csv"
        )
    allreduce: list[AllReduceRow] = []
    for path in sorted(base.glob("network/*/all_reduce.csv")):
        allreduce.extend(read_allreduce_csv(path, path.parts[-2]))
    return VidurProfiles(str(base), tuple(operators), tuple(allreduce))
