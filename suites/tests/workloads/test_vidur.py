"""The Vidur-layout reader: a good folder read whole, every malformed copy refused naming
file, line and column, and nothing half-read."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kvbench.workloads.efficiency import Efficiency
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.vidur import read_profiles

from .vidur_tree import LLAMA_7B, TOKENS, write_allreduce, write_model

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data" / "vidur"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write_model(
        tmp_path, "h100", "org/m7", LLAMA_7B, get_profile("h100"), Efficiency(0.9, 0.7, 5e-6)
    )
    write_allreduce(tmp_path, "h100_dgx")
    return tmp_path


def _edit(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    fn(rows)
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)


def test_a_good_folder_is_read_whole(tree: Path) -> None:
    data = read_profiles(tree)
    assert data.gpus() == ["h100"] and data.models("h100") == ["org/m7"]
    assert len(data.operators) == 4 * len(TOKENS)
    r = data.operators[0]
    assert (r.shape.n_head, r.shape.head_dim, r.shape.gated_mlp) == (32, 128, True)
    assert {a.num_workers for a in data.allreduce} == {2, 4, 8}


def test_missing_column_is_named(tree: Path) -> None:
    path = tree / "compute/h100/org/m7/mlp.csv"
    col = "time_stats.mlp_up_proj.median"

    def drop(rows: list[list[str]]) -> None:
        i = rows[0].index(col)
        for r in rows:
            del r[i]

    _edit(path, drop)
    with pytest.raises(ConfigError, match=rf"mlp.csv: line 1: missing column '{col}'"):
        read_profiles(tree)


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("time_stats.attn_pre_proj.median", "fast", "is not a number"),
        ("time_stats.add.median", "nan", "must be finite > 0"),
        ("time_stats.add.median", "-1", "must be finite > 0"),
        ("n_head", "3.5", "is not an integer"),
        ("use_gated_mlp", "maybe", "is not true/false"),
        ("num_tensor_parallel_workers", "", "is not a number"),
    ],
)
def test_bad_cell_is_named_by_file_line_and_column(
    tree: Path, column: str, value: str, says: str
) -> None:
    path = tree / "compute/h100/org/m7/mlp.csv"

    def poke(rows: list[list[str]]) -> None:
        rows[3][rows[0].index(column)] = value

    _edit(path, poke)
    with pytest.raises(ConfigError) as exc:
        read_profiles(tree)
    text = str(exc.value)
    assert str(path) in text and "line 4" in text and repr(column) in text and says in text


def test_empty_header_only_and_short_rows_are_refused(tree: Path) -> None:
    path = tree / "compute/h100/org/m7/mlp.csv"
    good = path.read_text()
    path.write_text("")
    with pytest.raises(ConfigError, match="empty file"):
        read_profiles(tree)
    path.write_text(good.splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match="no data rows"):
        read_profiles(tree)
    lines = good.splitlines()
    path.write_text("\n".join([lines[0], lines[1], "1,2,3"]) + "\n")
    with pytest.raises(ConfigError, match="line 3: 3 fields"):
        read_profiles(tree)


def test_bad_allreduce_and_bad_folders_are_refused(tree: Path, tmp_path: Path) -> None:
    ar = tree / "network/h100_dgx/all_reduce.csv"

    def poke(rows: list[list[str]]) -> None:
        rows[2][rows[0].index("size")] = "big"

    _edit(ar, poke)
    with pytest.raises(ConfigError, match=r"all_reduce.csv: line 3: column 'size'"):
        read_profiles(tree)
    with pytest.raises(ConfigError, match="does not exist"):
        read_profiles(tmp_path / "nope")
    with pytest.raises(ConfigError, match="is not a folder"):
        read_profiles(ar)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no compute"):
        read_profiles(tmp_path / "empty")


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/data/vidur not in this checkout")
def test_the_shared_copy_reads_as_documented() -> None:
    data = read_profiles(SHARED)
    assert data.gpus() == ["a100", "h100"]
    for gpu in data.gpus():
        assert data.models(gpu) == ["meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf"]
    assert len(data.operators) == 4 * 1044
    assert {r.tp for r in data.operators} == {1, 2, 4, 8}
    assert {r.num_tokens for r in data.operators} >= {1, 4096}
