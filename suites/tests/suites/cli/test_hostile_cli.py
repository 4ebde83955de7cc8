"""The hostile-input battery, command line: every subcommand, every numeric option with
negative, zero, NaN, infinite, huge and malformed values, every file option with missing,
directory, truncated, binary, non-UTF-8, empty, wrong-schema (and, where not root,
unreadable) files, and every output path that cannot be written. For each:

    exit status 2, exactly one line on stderr (`kvbench CMD: error: ...`), no traceback,
    and no file changed, created or removed anywhere under the working folder.

The CLI runs in-process through `main()` (fast); a few cases also run as a subprocess to
check the real exit status. Hypothesis adds random text for the numeric options and
random bytes for the input files. The files, outputs and issue 18's cases are in
`test_hostile_cli_files`, which shares this module's working folder and checks. `hostile.TRIED` counts what was tried, by kind (the
conftest prints it at the end of the session).
"""

from __future__ import annotations

import argparse
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
