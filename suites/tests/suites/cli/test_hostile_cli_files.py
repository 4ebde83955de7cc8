"""The hostile-input battery, command line, second half: every file option with missing,
directory, truncated, binary, non-UTF-8, empty, wrong-schema (and, where not root,
unreadable) files, every output path that cannot be written, and the cases issue 18 found.
Each must exit 2 with one line on stderr and change no file under the working folder
(the shared folder and checks: `test_hostile_cli`, whose docstring states the rules).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.suites.conformance.hostile import TRIED, assert_refused, run_cli
from kvbench.suites.tests.suites.cli.test_hostile_cli import _all_refused, _refused, workdir

__all__ = ["workdir"]  # the battery's fixture, shared


# ------------------------------------------------------------------ input files


def _results_file(path: Path, **bench: object) -> Path:
    """A small valid bench results file (header + one finished case)."""
    from kvbench.reports.store.writer import ResultWriter

    header = {"bench": {"sweeps": ["s"], "full": False, "seed": 0, "shard": None, **bench}}
    with ResultWriter(
        path.stem, path.parent, environment={"device": "t"}, header_fields=header
    ) as w:
        w.record("s", {"i": 1}, "m", 1.0, "s", {"median": 1.0, "q1": 0.9, "q3": 1.1, "n": 5})
        w.record("s", {"i": 1}, "case_wall_time", 0.1, "s")
    return path


def _bad_inputs(folder: Path) -> dict[str, Path]:
    """One file (or non-file) of each bad kind, made under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    good = _results_file(folder / "good.jsonl")
    made = {
        "missing": folder / "missing.jsonl",
        "directory": folder / "adir.jsonl",
        "empty": folder / "empty.jsonl",
        "binary": folder / "binary.jsonl",
        "non-UTF-8": folder / "latin1.jsonl",
        "truncated": folder / "truncated.jsonl",
        "wrong schema": folder / "wrong.jsonl",
        "deeply nested": folder / "nested.jsonl",
    }
    made["directory"].mkdir()
    made["empty"].write_bytes(b"")
    made["binary"].write_bytes(bytes(range(256)) * 8)
    made["non-UTF-8"].write_bytes('{"kind": "header", "x": "caf\u00e9"}\n'.encode("latin-1"))
    text = good.read_bytes()
    made["truncated"].write_bytes(text[: text.index(b"\n") // 2])
    made["wrong schema"].write_text(json.dumps({"format": "something else", "rows": [1, 2]}) + "\n")
    made["deeply nested"].write_text("[" * 50_000 + "\n")
    if os.geteuid() != 0:  # root reads anything: "unreadable" means nothing there
        made["unreadable"] = folder / "unreadable.jsonl"
        made["unreadable"].write_bytes(text)
        made["unreadable"].chmod(0)
    return made


#: (command, argv with {f} for the bad file, kinds that are not bad for it)
INPUT_OPTIONS: list[tuple[str, list[str], set[str]]] = [
    ("simulate", ["simulate", "--quiet", "--requests=2", "--trace", "{f}"], set()),
    ("bench", ["bench", "--no-progress", "--only", "capacity.footprint", "--resume", "{f}"], set()),
    ("report", ["report", "{f}", "--out", "site"], set()),
    ("report", ["report", "{good}", "--gate", "{f}", "--out", "site"], set()),
    ("merge", ["merge", "{f}", "{good}", "--into", "merged"], set()),
    ("results", ["results", "--export", "{f}", "--to", "x.csv"], {"truncated"}),
    ("gate", ["gate", "--baseline", "{f}", "--candidate", "{good}"], set()),
    ("gate", ["gate", "--no-static", "--candidate", "{f}"], set()),
    ("workload", ["workload", "--import", "mooncake:{f}", "--out", "imported.jsonl"], set()),
    ("workload", ["workload", "--import", "azure:{f}", "--out", "imported.jsonl"], set()),
    ("hitrate", ["hitrate", "-q", "--capacity=1e4", "--trace", "{f}"], set()),
    ("rate", ["rate", "--no-knee", "--rates=1", "--duration=1", "--trace", "{f}"], set()),
    ("capacity", ["capacity", "--kv-budget=1GB", "--hf-config", "{f}"], set()),
]


@pytest.fixture(scope="module")
def bad_files(workdir: Path) -> dict[str, Path]:
    return _bad_inputs(workdir / "in")


@pytest.mark.parametrize(
    ("command", "argv", "ok"),
    INPUT_OPTIONS,
    ids=[" ".join(a for a in argv if not a.startswith("{")) for _, argv, _ in INPUT_OPTIONS],
)
def test_bad_input_files_are_refused_in_one_line(
    workdir: Path, bad_files: dict[str, Path], command: str, argv: list[str], ok: set[str]
) -> None:
    good = str(workdir / "in" / "good.jsonl")
    cases = [
        (
            [a.replace("{f}", str(path)).replace("{good}", good) for a in argv],
            command,
            f"cli file: {kind}",
            None,
        )
        for kind, path in bad_files.items()
        if kind not in ok
    ]
    _all_refused(workdir, cases)


@settings(max_examples=25)
@given(data=st.binary(min_size=1, max_size=400), which=st.sampled_from(INPUT_OPTIONS[:3]))
def test_random_bytes_as_an_input_file_are_refused_in_one_line(
    workdir: Path, data: bytes, which: tuple
) -> None:
    command, argv, _ = which
    path = workdir / "random.jsonl"
    path.write_bytes(data)
    try:
        real = [a.replace("{f}", str(path)) for a in argv]
        _refused(workdir, real, command, "cli file: random bytes", None)
    finally:
        path.unlink()


# ------------------------------------------------------------------ output paths


def _outputs(folder: Path) -> dict[str, str]:
    (folder / "plain").write_text("not a folder\n")
    (folder / "foreign").mkdir()
    (folder / "foreign" / "notes.html").write_text("<p>someone else's page</p>\n")
    (folder / "existing").mkdir()
    return {
        "existing folder": str(folder / "existing"),
        "regular file": str(folder / "plain"),
        "below a regular file": str(folder / "plain" / "sub" / "x.jsonl"),
        "foreign folder": str(folder / "foreign"),
    }


#: (command, argv with {o} for the output path, the kinds it must refuse)
OUTPUT_OPTIONS: list[tuple[str, list[str], set[str]]] = [
    (
        "workload",
        ["workload", "--requests=2", "--out", "{o}"],
        {"existing folder", "below a regular file"},
    ),
    (
        "simulate",
        ["simulate", "--quiet", "--requests=2", "--out", "{o}"],
        {"regular file", "below a regular file"},
    ),
    (
        "bench",
        ["bench", "--no-progress", "--only", "capacity.footprint", "--out-dir", "{o}"],
        {"regular file", "below a regular file"},
    ),
    (
        "report",
        ["report", "{good}", "--out", "{o}"],
        {"regular file", "below a regular file", "foreign folder"},
    ),
    (
        "kernels",
        ["kernels", "--headline", "--json", "{o}"],
        {"existing folder", "below a regular file"},
    ),
    (
        "kernels",
        ["kernels", "--headline", "--results-dir", "{o}"],
        {"regular file", "below a regular file"},
    ),
    (
        "gate",
        ["gate", "--candidate", "{good}", "--json", "{o}"],
        {"existing folder", "below a regular file"},
    ),
    (
        "gate",
        ["gate", "--candidate", "{good}", "--html", "{o}"],
        {"existing folder", "below a regular file"},
    ),
    (
        "results",
        ["results", "--export", "{good}", "--to", "{o}"],
        {"existing folder", "below a regular file"},
    ),
]


@pytest.mark.parametrize(
    ("command", "argv", "kinds"),
    OUTPUT_OPTIONS,
    ids=[" ".join(argv[:1] + argv[-2:-1]) for _, argv, _ in OUTPUT_OPTIONS],
)
def test_unwritable_outputs_are_refused_before_anything_is_written(
    workdir: Path, command: str, argv: list[str], kinds: set[str]
) -> None:
    folder = workdir / f"out-{command}-{argv[-2].lstrip('-')}"
    folder.mkdir()
    good = str(_results_file(folder / "good.jsonl"))
    targets = _outputs(folder)
    cases = [
        (
            [a.replace("{o}", targets[kind]).replace("{good}", good) for a in argv],
            command,
            f"cli output: {kind}",
            None,
        )
        for kind in sorted(kinds)
    ]
    _all_refused(workdir, cases)


# ------------------------------------------------------------------ the issue's cases


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["utilization", "--std", "-1"], "--std"),
        (["utilization", "--mean", "nan"], "--mean"),
        (["kernels", "--workers", "-1"], "--workers"),
        (["simulate", "--max-seq-len", "0"], "--max-seq-len"),
        (["simulate", "--kv-budget", "1000TB", "--quiet"], "1000TB"),
        (["gate", "--min-effect", "nan"], "--min-effect"),
        (["gate", "--cross-min-effect", "nan"], "--cross-min-effect"),
        (["gate", "--sass-pct", "nan"], "--sass-pct"),
        (["capacity", "--kv-budget", "42GB", "--tp", "3"], "tp=3 cannot split 8 KV heads"),
        (["capacity", "--kv-budget", "42GB", "--avg-len", "5000"], "avg_len=5000"),
        (["workload", "--out", "missing-parent-is-a-file/x/y.jsonl"], "which is a file"),
        (["workload", "--out", "."], "is a folder"),
        (["bench", "--out-dir", "missing-parent-is-a-file/results"], "which is a file"),
        (["report", "--out", "missing-parent-is-a-file"], "is a file"),
        (["utilization", "--results", "../escape"], "invalid run id"),
        (["bench", "--run-id", "a b"], "invalid run id"),
    ],
)
def test_issue_18_cases_are_refused_in_one_line(workdir: Path, argv: list[str], names: str) -> None:
    blocker = workdir / "missing-parent-is-a-file"
    if not blocker.exists():
        blocker.write_text("x\n")
    _refused(workdir, argv, argv[0], "cli: issue 18 case", names)


def test_simulate_checks_the_budget_before_allocating(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1000 TB of Llama-2-70B KV is 190 million blocks: the bookkeeping alone would not fit;
    refused before any pool is built."""
    from kvbench.paged import cache_spec

    def no_build(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a cache was built before the budget was checked")

    monkeypatch.setattr(cache_spec.CacheSpec, "build", no_build)
    _refused(
        workdir,
        ["simulate", "--kv-budget", "1000TB", "--requests", "2", "--quiet"],
        "simulate",
        "cli: issue 18 case",
        "190,734,863 blocks",
    )


@pytest.mark.parametrize("payload", [os.urandom(2048), "é\n".encode("latin-1") * 10])
def test_simulate_trace_of_random_or_non_utf8_bytes(workdir: Path, payload: bytes) -> None:
    trace = workdir / "t.jsonl"
    trace.write_bytes(payload)
    _refused(
        workdir,
        ["simulate", "--trace", str(trace), "--quiet"],
        "simulate",
        "cli: issue 18 case",
        "t.jsonl",
    )


def test_bench_resume_of_a_garbage_file_leaves_it_unchanged(workdir: Path) -> None:
    garbage = workdir / "garbage.jsonl"
    garbage.write_bytes(b"\x00\x01 not a run\n{}\n")
    _refused(
        workdir,
        ["bench", "--resume", str(garbage), "--only", "capacity.footprint"],
        "bench",
        "cli: issue 18 case",
        "garbage.jsonl",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["utilization", "--results", "garbage"],
        ["kernels", "--headline", "--run-id", "garbage"],
    ],
)
def test_rows_are_never_appended_to_a_file_that_is_not_a_run(
    workdir: Path, argv: list[str]
) -> None:
    (workdir / "out" / "results").mkdir(parents=True, exist_ok=True)
    (workdir / "out" / "results" / "garbage.jsonl").write_bytes(b"\x00 not a run\n")
    _refused(workdir, argv, argv[0], "cli: issue 18 case", "garbage.jsonl")


def test_bench_run_id_of_an_existing_run_is_refused(workdir: Path) -> None:
    (workdir / "out" / "results").mkdir(parents=True, exist_ok=True)
    _results_file(workdir / "out" / "results" / "taken.jsonl")
    _refused(
        workdir,
        ["bench", "--run-id", "taken", "--only", "capacity.footprint"],
        "bench",
        "cli: issue 18 case",
        "already exists",
    )


def test_report_of_a_merged_run_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After `kvbench merge`, a plain `kvbench report` reports the merged run, not the
    last shard."""
    workdir = tmp_path
    monkeypatch.chdir(workdir)
    results = workdir / "out" / "results"
    for k in (1, 2):
        _results_file(results / f"shard{k}.jsonl", shard=f"{k}/2")
    code, _, err = run_cli(["merge", "shard1", "shard2", "--into", "whole"])
    assert code == 0, err
    code, _, err = run_cli(["report", "--out", "site"])
    assert code == 0, err
    index = (workdir / "site" / "index.html").read_text()
    assert "<code>whole</code>" in index and "<code>shard2</code>" not in index


@pytest.mark.parametrize(
    "argv",
    [
        ["utilization", "--std", "-1"],
        ["kernels", "--workers", "-1"],
        ["gate", "--min-effect", "nan"],
        ["simulate", "--trace", "/dev/null/not-a-file", "--quiet"],
    ],
)
def test_real_process_exits_2_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    """A few cases through a real `python -m kvbench` process: the exit status the shell
    sees and nothing else on stderr (no logging, no warnings, no traceback)."""
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert_refused(done.returncode, done.stderr, argv[0])
    assert list(tmp_path.iterdir()) == []
    TRIED["cli: real process"] += 1


def test_calibrate_refuses_bad_profile_folders_and_outputs(workdir: Path) -> None:
    """Malformed mlp.csv (named with its line and column), a GPU with no fitted profile
    under --judge, a folder with no mlp.csv, and a --csv that cannot be written: refused
    in one line, nothing written."""
    from kvbench.suites.tests.workloads.vidur_tree import LLAMA_7B, write_model
    from kvbench.workloads.efficiency import Efficiency
    from kvbench.workloads.profiles import get_profile

    base = workdir / "calib"
    eff = Efficiency(0.9, 0.7, 5e-6)
    bad = base / "bad"
    path = write_model(bad, "h100", "org/m", LLAMA_7B, get_profile("h100"), eff)
    lines = path.read_text().splitlines()
    cells = lines[2].split(",")
    cells[lines[0].split(",").index("time_stats.attn_pre_proj.median")] = "oops"
    path.write_text("\n".join([lines[0], lines[1], ",".join(cells), *lines[3:]]) + "\n")
    write_model(base / "cpu", "cpu", "org/m", LLAMA_7B, get_profile("cpu"), eff)
    write_model(base / "good", "h100", "org/m", LLAMA_7B, get_profile("h100"), eff)
    (base / "none").mkdir()
    (base / "blocker").write_text("x\n")
    good = str(base / "good")
    huge = base / "huge"
    path = write_model(huge, "h100", "org/m", LLAMA_7B, get_profile("h100"), eff)
    lines = path.read_text().splitlines()
    cells = lines[1].split(",")
    cells[lines[0].split(",").index("n_embd")] = "1e300"
    path.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    binary = base / "binary"
    path = write_model(binary, "h100", "org/m", LLAMA_7B, get_profile("h100"), eff)
    path.write_bytes(b"\xff\xfe" + path.read_bytes())
    cases = [
        (["calibrate", "gpu", "--profiles", str(bad)], "line 3: column"),
        (["calibrate", "gpu", "--judge", str(base / "cpu")], "'cpu'"),
        (["calibrate", "gpu", "--profiles", str(base / "none")], "holds no compute"),
        (["calibrate", "gpu", "--judge", str(huge)], "'n_embd': '1e300' is above"),
        (["calibrate", "gpu", "--judge", str(binary)], "mlp.csv: not UTF-8 text"),
        (["calibrate", "gpu", "--profiles", good, "--csv", "."], None),
        (["calibrate", "gpu", "--profiles", good, "--csv", "calib/blocker/x.csv"], "is a file"),
    ]
    _all_refused(
        workdir, [(argv, "calibrate", "cli file: calibrate profiles", n) for argv, n in cases]
    )


def test_folders_and_runs_given_wrongly_are_refused(workdir: Path) -> None:
    (workdir / "dirs").mkdir(exist_ok=True)
    plain = workdir / "dirs" / "plain"
    plain.write_text("a file\n")
    good = _results_file(workdir / "dirs" / "r.jsonl")
    cases = [
        ([c, "--dir", str(plain)], c, "cli file: folder is a file", "is a file")
        for c in ("results", "report", "merge", "gate")
    ]
    cases[2] = (
        ["merge", "x", "--dir", str(plain)],
        "merge",
        "cli file: folder is a file",
        "is a file",
    )
    cases.append(
        (["report", str(good), str(good), "--out", "s"], "report", "cli file: run twice", "twice")
    )
    cases.append((["merge", str(good), str(good)], "merge", "cli file: run twice", "twice"))
    _all_refused(workdir, cases)
