"""`kvbench workload`: write a trace file from a seeded generator, or import one.

Examples:
    kvbench workload --workload sharegpt --requests 1000 --arrivals poisson:2 \
        --sharing system-prompt --system-tokens 500 --tenants 4 --out out/traces/sg.jsonl
    kvbench workload --import mooncake:conversation_trace.jsonl --out out/traces/mc.jsonl
    kvbench workload --import azure:AzureLLMInferenceTrace_conv.csv --speed 2 --out az.jsonl

`--import FORMAT:PATH` reads a production trace (`workloads.trace_import`: mooncake JSONL
or azure CSV, also gzip-compressed) instead of generating; `--speed S` (in [1e-6, 1e6])
divides its arrival times by S. A bad file is refused (exit 2, one line naming the line
and field) and nothing is written: every length must lie in [1, 2^24] tokens and every
arrival, after the speed, in [0, 2^22 s] (`workloads.trace`: the bounds and why).
Generated traces are held to the same bounds: a spec whose arrivals or lengths would
pass them (`--arrivals poisson:1e-300`, `--input-dist fixed:10^30`) is refused naming
the option.
"""

from __future__ import annotations

import argparse
import sys

from kvbench.suites.cli.argtypes import check_output_file, float_range, int_range
from kvbench.workloads.arrivals import parse_arrivals
from kvbench.workloads.distributions import parse_distribution
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.sharing import SHARING_PATTERNS, WORKLOAD_NAMES, generate
from kvbench.workloads.time_scale import MAX_TIME_SCALE, MIN_TIME_SCALE
from kvbench.workloads.trace import TraceError

#: The generator option a trace field's value comes from (an out-of-bounds request).
_FIELD_OPTIONS = {
    "arrival": "--arrivals",
    "prompt_len": "--input-dist",
    "output_len": "--output-dist",
    "n": "--n",
    "beam_width": "--beam-width",
}

#: Bounds of the generator options: far past any sweep, small enough to fit in memory.
MAX_REQUESTS = 10_000_000
MAX_TOKENS = 1 << 20


def add_generator_args(p: argparse.ArgumentParser) -> None:
    """Generator options shared by `workload` and `simulate`."""
    p.add_argument("--workload", default="sharegpt", help=f"one of {', '.join(WORKLOAD_NAMES)}")
    p.add_argument(
        "--requests",
        type=int_range(1, MAX_REQUESTS),
        default=1000,
        help="requests (prompts) to generate",
    )
    p.add_argument("--seed", type=int_range(0, 2**63 - 1), default=0)
    p.add_argument("--arrivals", default="all", help="all | poisson:RATE | burst:SIZE:INTERVAL")
    p.add_argument("--sharing", default="none", help=f"one of {', '.join(SHARING_PATTERNS)}")
    p.add_argument("--system-tokens", type=int_range(0, MAX_TOKENS), default=500)
    p.add_argument("--tenants", type=int_range(1, MAX_REQUESTS), default=1)
    p.add_argument("--turns", type=int_range(1, 10_000), default=4)
    p.add_argument(
        "--n", type=int_range(1, 1024), default=4, help="samples per prompt (--sharing parallel)"
    )
    p.add_argument("--beam-width", type=int_range(1, 1024), default=4)
    p.add_argument("--input-dist", default=None, help="override prompt lengths (spec string)")
    p.add_argument("--output-dist", default=None, help="override output lengths (spec string)")


def _dist(option: str, spec: str | None):  # type: ignore[no-untyped-def]
    """The length distribution `spec` names (ConfigError naming `option`), or None."""
    if not spec:
        return None
    try:
        return parse_distribution(spec)
    except ConfigError as exc:
        raise ConfigError(f"{option} {spec!r}: {exc}") from None


def trace_from_args(args: argparse.Namespace):
    """Build the trace the generator options describe; a request the trace format
    refuses (an arrival past 2^22 s, a length past 2^24) is refused naming the option
    it came from."""
    try:
        arrivals = parse_arrivals(args.arrivals)
    except ConfigError as exc:
        raise ConfigError(f"--arrivals {args.arrivals!r}: {exc}") from None
    try:
        return generate(
            args.workload,
            args.requests,
            seed=args.seed,
            arrivals=arrivals,
            sharing=args.sharing,
            system_tokens=args.system_tokens,
            tenants=args.tenants,
            turns=args.turns,
            n=args.n,
            beam_width=args.beam_width,
            prompt=_dist("--input-dist", args.input_dist),
            output=_dist("--output-dist", args.output_dist),
        )
    except TraceError as exc:
        option = _FIELD_OPTIONS.get(exc.field or "", "the generator options")
        given = {"--arrivals": args.arrivals}.get(option)
        raise ConfigError(
            f"{option}{f' {given!r}' if given else ''} makes a request the trace format "
            f"refuses: {str(exc).split(': ', 1)[-1]}"
        ) from None


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    if args.import_spec is not None:
        from kvbench.workloads.trace_import import import_trace

        trace = import_trace(args.import_spec, args.speed)
    elif args.speed != 1.0:
        raise ConfigError("--speed applies to an imported trace (--import FORMAT:PATH)")
    else:
        trace = trace_from_args(args)
    path = trace.write(args.out)
    prompts = sum(r.prompt_len for r in trace.requests)
    outputs = sum(r.output_len for r in trace.requests)
    n = max(len(trace), 1)
    sys.stdout.write(
        f"wrote {len(trace)} requests to {path} "
        f"(mean prompt {prompts / n:.2f}, mean output {outputs / n:.2f} tokens)\n"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("workload", help="write a trace file from a seeded generator")
    add_generator_args(p)
    p.add_argument("--out", default="out/traces/trace.jsonl", help="trace file to write")
    p.add_argument(
        "--import",
        dest="import_spec",
        default=None,
        metavar="FORMAT:PATH",
        help="import a production trace instead: mooncake:FILE.jsonl or azure:FILE.csv",
    )
    p.add_argument(
        "--speed",
        type=float_range(MIN_TIME_SCALE, MAX_TIME_SCALE),
        default=1.0,
        help="divide an imported trace's arrival times by this (2 = twice as fast; in "
        "[1e-6, 1e6], and every arrival after it within 2^22 s)",
    )
    p.set_defaults(func=run)
