"""The hostile-input battery, command line: every subcommand, every numeric option with
negative, zero, NaN, infinite, huge and malformed values, every file option with missing,
directory, truncated, binary, non-UTF-8, empty, wrong-schema (and, where not root,
unreadable) files, and every output path that cannot be written. For each:

    exit status 2, exactly one line on stderr (`kvbench CMD: error: ...`), no traceback,
    and no file changed, created or removed anywhere under the working folder.

The CLI runs in-process through `main()` (fast); a few cases also run as a subprocess to
check the real exit status. Hypothesis adds random text for the numeric options and
random bytes for the input files. `hostile.TRIED` counts what was tried, by kind (the
conftest prints it at the end of the session).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.suites.cli import build_parser
from kvbench.suites.cli import simulate as simulate_cmd
from kvbench.suites.conformance.hostile import TRIED, assert_refused, run_cli, tree_digest

# ------------------------------------------------------------------ numeric options

#: Values of each kind that no numeric option may accept (negative and zero aside: see
#: ZERO_OK). `--opt=VALUE` keeps argparse from reading '-1' as an option.
BAD_NUMBERS: dict[str, tuple[str, ...]] = {
    "negative": ("-1", "-1e300"),
    "zero": ("0",),
    "nan": ("nan",),
    "infinite": ("inf", "-inf"),
    "huge": ("1e400", "9" * 40),
    "malformed": ("", "abc", "1,5", "½"),
}

#: Options for which zero is a meaningful value (no warm-up, no slack, seed 0, ...).
ZERO_OK = {
    ("bench", "--warmup"),
    ("bench", "--seed"),
    ("simulate", "--seed"),
    ("workload", "--seed"),
    ("rate", "--seed"),
    ("utilization", "--seed"),
    ("utilization", "--std"),
    ("simulate", "--static-batch-size"),
    ("simulate", "--watermark"),
    ("simulate", "--system-tokens"),
    ("workload", "--system-tokens"),
    ("gate", "--inject-slowdown"),
    ("gate", "--register-slack"),
    ("gate", "--shared-slack"),
    ("gate", "--sass-pct"),
    ("gate", "--min-effect"),
    ("gate", "--cross-min-effect"),
}

#: Options that take numbers through their own parsers (lists, sizes, K/N), with values
#: each must refuse.
SPECIAL_NUMBERS: list[tuple[str, list[str], str]] = [
    ("utilization", ["--batch-sizes=0"], "'0'"),
    ("utilization", ["--batch-sizes=-5,10"], "'-5,10'"),
    ("utilization", ["--batch-sizes=10,nan"], "'10,nan'"),
    ("utilization", ["--batch-sizes=1e12"], "'1e12'"),
    ("utilization", ["--batch-sizes=,"], "','"),
    ("capacity", ["--kv-budget=-4GB"], "-4GB"),
    ("capacity", ["--kv-budget=nanGB"], "nanGB"),
    ("capacity", ["--kv-budget=0GB"], "0GB"),
    ("capacity", ["--kv-budget=1e9999GB"], "1e9999GB"),
    ("capacity", ["--kv-budget=" + "9" * 400 + "GB"], "too large"),
    ("simulate", ["--kv-budget=infGB"], "infGB"),
    ("simulate", ["--kv-budget=lots"], "lots"),
    ("simulate", ["--kv-budget=1B"], "'1B'"),
    ("bench", ["--shard=0/4"], "0/4"),
    ("bench", ["--shard=5/4"], "5/4"),
    ("bench", ["--shard=-1/4"], "-1/4"),
    ("bench", ["--shard=nan"], "nan"),
    ("rate", [f"--trace={__file__}", "--time-scale=0"], "0.0"),
    ("rate", [f"--trace={__file__}", "--time-scale=-1"], "-1.0"),
    ("rate", [f"--trace={__file__}", "--time-scale=nan"], "nan"),
    ("rate", [f"--trace={__file__}", "--time-scale=1,x"], "'x'"),
    ("rate", [f"--trace={__file__}", "--time-scale=1e400"], "inf"),
    ("kernels", ["--arch=75"], "75"),
    ("kernels", ["--arch=nan"], "nan"),
    *(
        ("hitrate", ["--trace=no-such.jsonl", f"--capacity={bad}"], f"'{bad}'")
        for bad in ("0", "-5", "nan", "inf", "1e400", "1.5", "1e13")
    ),
    ("hitrate", ["--trace=no-such.jsonl", "--capacity=3e6,"], "''"),
    ("hitrate", ["--trace=no-such.jsonl", "--block-size=64", "--capacity=32"], "'32'"),
]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def numeric_options() -> list[tuple[str, str, Callable[[str], object]]]:
    """(command, option, type) of every option whose type is int, float or a ranged
    numeric type from suites/cli/argtypes.py."""
    out = []
    for name, p in _subparsers().items():
        for action in p._actions:
            t = action.type
            if not action.option_strings or t is None:
                continue
            if t in (int, float) and action.choices is not None:
                out.append((name, action.option_strings[-1], _choice(t, action.choices)))
            elif t in (int, float) or hasattr(t, "bounds"):
                out.append((name, action.option_strings[-1], t))
    return out


def _choice(t: Callable[[str], object], choices) -> Callable[[str], object]:  # type: ignore[no-untyped-def]
    """The type of a numeric option with choices: refuses what is not one of them."""

    def parse(text: str) -> object:
        value = t(text)
        if value not in choices:
            raise ValueError(f"{text!r} is not one of {choices}")
        return value

    parse.bounds = (min(choices), max(choices))  # type: ignore[attr-defined]
    return parse


NUMERIC = numeric_options()


def test_every_numeric_option_is_range_checked() -> None:
    """A bare `type=int` or `type=float` lets NaN, infinities or negatives through: each
    numeric option must use a ranged type from argtypes."""
    bare = [f"{c} {o}" for c, o, t in NUMERIC if t in (int, float)]
    assert not bare, f"numeric options without a range: {bare}"
    assert len(NUMERIC) >= 40  # every subcommand's numbers are in the battery


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One working folder for the module (the CLI's default out/ lands here): a refused
    command leaves it as it was, so the cases can share it, and one that changed it fails.
    simulate sees 8 GiB of free memory whatever this machine has, and a command that
    reached the expensive work (the gate's measurement, the kernel compile, the
    simulation, a rate run, a hit-rate pass) fails at once (exit 70) instead of running
    for minutes (or, on a trace of 10^30-token prompts, exhausting memory)."""
    from kvbench.kernels import aot
    from kvbench.paged.serving import rate as serving_rate
    from kvbench.suites.gate import run as gate_run
    from kvbench.workloads import prefix_oracle

    def reached(what: str):  # type: ignore[no-untyped-def]
        def stop(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"bad input reached {what}")

        return stop

    work = tmp_path_factory.mktemp("hostile") / "work"
    work.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setattr(simulate_cmd, "available_memory_bytes", lambda: 8 * 2**30)
        mp.setattr(gate_run, "measure", reached("the gate's measurement"))
        mp.setattr(aot, "compile_all", reached("the kernel compile"))
        mp.setattr(simulate_cmd, "simulate", reached("the simulation"))
        mp.setattr(serving_rate, "run_system", reached("a rate run"))
        mp.setattr(prefix_oracle, "block_accesses", reached("the hit-rate pass"))
        yield work


def _refused(workdir: Path, argv: list[str], command: str, kind: str, names: str | None) -> None:
    before = tree_digest(workdir)
    code, _, err = run_cli(argv)
    assert_refused(code, err, command, names)
    assert tree_digest(workdir) == before, f"{argv} changed files"
    TRIED[kind] += 1


def _all_refused(workdir: Path, cases: list[tuple[list[str], str, str, str | None]]) -> None:
    """Run every (argv, command, kind, names) case; fail listing each that was not
    refused cleanly."""
    failures = []
    for argv, command, kind, names in cases:
        try:
            _refused(workdir, argv, command, kind, names)
        except AssertionError as exc:
            failures.append(f"{' '.join(argv)!r}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("command", "option"), [(c, o) for c, o, _ in NUMERIC], ids=[f"{c} {o}" for c, o, _ in NUMERIC]
)
def test_bad_numbers_are_refused_in_one_line(workdir: Path, command: str, option: str) -> None:
    """Negative, zero (where zero means nothing), NaN, infinite, huge and malformed
    values of every numeric option: one-line refusals naming the option."""
    cases = [
        ([command, f"{option}={value}"], command, f"cli number: {kind}", option)
        for kind, values in BAD_NUMBERS.items()
        for value in values
        if not (kind == "zero" and (command, option) in ZERO_OK)
    ]
    _all_refused(workdir, cases)


@pytest.mark.parametrize(("command", "argv", "names"), SPECIAL_NUMBERS)
def test_bad_number_in_a_spec_is_refused_in_one_line(
    workdir: Path, command: str, argv: list[str], names: str
) -> None:
    extra = ["--kv-budget=1GB"] if command == "capacity" and "--kv-budget" not in argv[0] else []
    _refused(workdir, [command, *argv, *extra], command, "cli number: in a spec", names)


#: Block sizes every `--block-size` refuses (the one range, `workloads.block_size`), and
#: ones every subcommand takes (3: no power-of-two rule; the bounds themselves).
BAD_BLOCK_SIZES = ("0", "-1", str(10**9), "65537", "abc", "1.5")
GOOD_BLOCK_SIZES = ("3", "1", "16", "65536")
BLOCK_SIZE_COMMANDS = sorted(c for c, o, _ in NUMERIC if o == "--block-size")


@pytest.mark.parametrize("command", BLOCK_SIZE_COMMANDS)
def test_every_block_size_option_refuses_the_same_values(workdir: Path, command: str) -> None:
    """Each subcommand with `--block-size` (found in the parser, not listed by hand)
    refuses 0, -1, 10^9, 2^16 + 1, words and fractions in one line naming the option,
    and its type takes 3 and the range's ends."""
    assert len(BLOCK_SIZE_COMMANDS) >= 4  # capacity, hitrate, simulate, utilization
    cases = [
        ([command, f"--block-size={v}"], command, "cli block size", f"--block-size: {v!r}")
        for v in BAD_BLOCK_SIZES
    ]
    _all_refused(workdir, cases)
    parse = {o: t for c, o, t in NUMERIC if c == command}["--block-size"]
    assert [parse(v) for v in GOOD_BLOCK_SIZES] == [int(v) for v in GOOD_BLOCK_SIZES]


@settings(max_examples=60)
@given(option=st.sampled_from(NUMERIC), text=st.text(max_size=12))
def test_random_text_for_a_number_is_taken_or_refused_in_one_line(
    workdir: Path, option: tuple, text: str
) -> None:
    """Any text the option's type refuses makes the whole command refuse cleanly."""
    command, name, parse = option
    if text.strip() == "--":
        return  # argparse reads `--opt=--` as "no value given": the option's default
    try:
        parse(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        pass
    else:
        return  # a value the option takes; running the command is not this test's job
    _refused(workdir, [command, f"{name}={text}"], command, "cli number: random text", name)


#: Options that take a word from a vocabulary or a spec string, with bad values.
BAD_WORDS: list[tuple[str, list[str], str]] = [
    ("workload", ["--import=foo:x.jsonl"], "'foo'"),
    ("workload", ["--import=mooncake"], "'mooncake'"),
    ("workload", ["--import=mooncake:"], "'mooncake:'"),
    ("workload", ["--speed=2"], "--speed"),
    ("hitrate", ["--trace=no-such.jsonl", "--policy=fifo"], "'fifo'"),
    ("simulate", ["--workload=foo"], "'foo'"),
    ("simulate", ["--arrivals=poisson:-1"], "-1"),
    ("simulate", ["--arrivals=poisson:nan"], "nan"),
    ("simulate", ["--arrivals=burst:0:1"], "0"),
    ("simulate", ["--arrivals=sometimes"], "'sometimes'"),
    ("simulate", ["--sharing=foo"], "'foo'"),
    ("simulate", ["--input-dist=weird"], "'weird'"),
    ("simulate", ["--input-dist=normal:nan,1"], "'normal:nan,1'"),
    ("simulate", ["--output-dist=fixed:-5"], "-5"),
    ("simulate", ["--policy=foo"], "'foo'"),
    ("simulate", ["--batching=foo"], "'foo'"),
    ("simulate", ["--mode=foo"], "'foo'"),
    ("simulate", ["--sample-preemption=foo"], "'foo'"),
    ("simulate", ["--cache=,"], "''"),
    ("simulate", ["--cache=paged,bogus"], "'bogus'"),
    ("simulate", ["--model=gpt-9"], "'gpt-9'"),
    ("simulate", ["--profile=tpu"], "'tpu'"),
    ("simulate", ["--max-num-seqs=9000", "--max-batched-tokens=10"], "9000"),
    ("workload", ["--workload="], "''"),
    ("workload", ["--arrivals=poisson:1e400"], "inf"),
    ("capacity", ["--kv-budget=1GB", "--dtype="], "''"),
    ("capacity", ["--kv-budget=1GB", "--dtype=int3"], "'int3'"),
    ("capacity", ["--kv-budget=1GB", "--model="], "''"),
    ("capacity", ["--kv-budget=1GB", "--kv-heads=6", "--tp=4"], "tp=4"),
    ("capacity", ["--kv-budget=1GB", "--format=xml"], "'xml'"),
    ("capacity", ["--kv-budget=1GB", "--model=mistral-7b", "--tp=2"], "--tp=2"),
    ("capacity", ["--kv-budget=1GB", "--model=gemma-2-9b", "--layers=3"], "--layers"),
    ("capacity", ["--kv-budget=1GB", "--model=llama-3-8b", "--step-tokens=4"], "--step-tokens"),
    ("capacity", ["--kv-budget=1GB", "--model=whisper-large-v3", "--encoder-len=9"], "encoder"),
    ("capacity", ["--kv-budget=1GB", "--model=mistral-7b", "--avg-len=9000"], "avg_len=9000"),
    ("utilization", ["--format=xml"], "'xml'"),
    ("utilization", ["--min-len=3000"], "3000"),
    (
        "utilization",
        ["--mean=1000000", "--max-len=1000000", "--min-len=1000", "--batch-sizes=10000"],
        "blocks of 16 tokens",
    ),
    ("utilization", ["--shared-requests=10000", "--system-prompt=1000000"], "blocks"),
    ("bench", ["--only", "nonexistent"], "'nonexistent'"),
    ("bench", ["--resume=x", "--run-id=y"], "not both"),
    ("results", ["--to=x.csv"], "--export"),
    ("results", ["--export=latest", "--to=x.xlsx"], ".xlsx"),
    ("report", ["--all", "x"], "not both"),
    ("gate", ["--alpha=1"], "--alpha"),
    ("gate", ["--alpha=0"], "--alpha"),
    ("gate", ["--min-effect=1.5"], "--min-effect"),
    ("gate", ["--register-slack=2.5"], "--register-slack"),
    ("rate", ["--rates=1e9"], "1e+09"),
    ("rate", ["--rates=nan"], "nan"),
    ("rate", ["--rates=1,,2"], "''"),
    ("rate", ["--rates=1", "--burstiness=nan"], "nan"),
    ("rate", ["--system=foo"], "'foo'"),
    ("rate", ["--setup=foo"], "'foo'"),
    ("rate", ["--time-scale=2"], "--trace"),
    ("rate", ["--trace=no-such-trace.jsonl"], "no-such-trace.jsonl"),
    ("simulate", ["--burstiness=2"], "--arrivals"),
    ("simulate", ["--burstiness=2", "--arrivals=burst:2:1"], "poisson:RATE"),
    ("simulate", ["--burstiness=2", "--arrivals=poisson:-3"], "-3"),
    ("merge", [], None),
    ("no-such-command", [], "no-such-command"),
    ("calibrate", ["cpu", "--profiles=x"], "'cpu'"),
    ("calibrate", ["gpu"], "--profiles"),
    ("calibrate", ["gpu", "--profiles=a", "--judge=b"], "not allowed"),
    ("calibrate", ["gpu", "--profiles=no-such-folder"], "no-such-folder"),
    ("calibrate", ["gpu", "--judge="], "''"),
]


@pytest.mark.parametrize(
    ("command", "argv", "names"), BAD_WORDS, ids=[" ".join([c, *a]) for c, a, _ in BAD_WORDS]
)
def test_bad_word_or_spec_is_refused_in_one_line(
    workdir: Path, command: str, argv: list[str], names: str | None
) -> None:
    shown = "kvbench" if command == "no-such-command" else command
    _refused(workdir, [command, *argv], shown, "cli word: bad vocabulary or spec", names)


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
