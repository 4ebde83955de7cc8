"""Every sweep page, figure caption, table and the index's sweep table say what produced
the numbers; pages of modeled / predicted / closed-form sweeps never read as measured on
the run's device."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import pytest

from kvbench.reports import provenance as P
from kvbench.reports.site import build_site
from kvbench.reports.store.reader import load_run
from kvbench.reports.store.writer import ResultWriter


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prov")
    env = {"device": "cpu", "cpu_model": "Test CPU", "cpu_count": 2}
    declared = {  # as the runner writes it: each sweep's declaration, from its registration
        "serving.rate": [P.MODELED],
        "kernel.decode": [P.MEASURED],
        "capacity.footprint": [P.CLOSED_FORM],
        "trace.serving": [P.MODELED, P.MEASURED],
    }
    header = {"bench": {"produced": declared}}
    with ResultWriter("p", root, environment=env, header_fields=header) as w:
        case = {
            "setup": "opt-13b-1xa100-40gb",
            "workload": "sharegpt",
            "system": "paged",
            "rate": 1.0,
        }
        w.record("serving.rate", case, "normalized_latency", 0.1, "s/token")
        stats = {"median": 1e-3, "q1": 9e-4, "q3": 1.1e-3, "n": 5}
        case = {"block_size": 16, "ctx_len": 128, "batch": 1, "dtype": "float32", "gqa": 4}
        w.record("kernel.decode", case, "time_paged", 1e-3, "s", stats)
        w.record("kernel.decode", case, "kernel_path_is_cpp", 1.0, "bool")
        w.record(
            "capacity.footprint", {"model": "m", "dtype": "float16"}, "bytes_per_token", 2.0, "B"
        )
        trace = {"setup": "llama-3-70b-8xh100-tp8", "window_s": 300.0}
        for scale in (0.5, 1.0):
            case = {**trace, "view": "grid", "time_scale": scale}
            w.record("trace.serving", case, "goodput", 2.0 * scale, "requests/s")
        case = {**trace, "view": "replay", "time_scale": 1.0}
        w.record("trace.serving", case, "replay_wall_time", 3.0, "s", stats)
    build_site([load_run(root / "p.jsonl")], root / "site")
    return root / "site"


def _text(path: Path) -> str:
    """The page's text without its tags, whitespace folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", path.read_text())).split())


def test_index_tags_every_sweep(site: Path) -> None:
    index = _text(site / "index.html")
    assert "<th>numbers produced by</th>" in (site / "index.html").read_text()
    assert "modeled (1xa100-40gb)" in index
    assert "measured here (CPU)" in index
    assert "closed form" in index


@pytest.mark.parametrize(
    ("page", "tag", "measured"),
    [
        ("sweep-serving.rate.html", "modeled (1xa100-40gb)", False),
        ("sweep-capacity.footprint.html", "closed form", False),
        ("sweep-kernel.decode.html", "measured here (CPU)", True),
    ],
)
def test_sweep_pages_say_what_produced_them(
    site: Path, page: str, tag: str, measured: bool
) -> None:
    text = _text(site / page)
    assert f"Produced by: {tag}" in text
    assert f"Table ({tag})" in text
    assert ("device cpu (Test CPU" in text) == measured  # never "device cpu" when modeled
    assert ("computed on host cpu" in text) != measured
    assert "Measured in run" not in text


def test_kinds_come_from_the_header_never_from_the_description() -> None:
    """A run's header declares each sweep's kinds; a results file from before the
    declaration reads the frozen legacy table; a sweep neither names is 'not stated',
    whatever its description or statistics say (nothing is guessed)."""
    empty = pd.DataFrame({"metric": ["m"], "value": [1.0]})
    header = {"bench": {"produced": {"trace.new": [P.MODELED], "kernel.decode": [P.MODELED]}}}
    declared = P.declared_kinds([header])
    assert P.kinds_of("trace.new", declared) == (P.MODELED,)
    assert P.kinds_of("kernel.decode", declared) == (P.MODELED,)  # the header wins
    assert P.kinds_of("kernel.decode", {}) == (P.MEASURED,)  # legacy table
    assert P.kinds_of("trace.other", declared) == (P.NOT_STATED,)
    junk = P.declared_kinds([{"bench": {"produced": {"a": ["guessed"], "b": "x"}}}, {}])
    assert junk == {"a": (P.NOT_STATED,)}
    gpu = empty.assign(metric="backend_is_triton")
    assert P.produced("kernel.decode", gpu).tag() == "measured here (GPU)"
    # numbers measured on GPUs elsewhere (Vidur's profiles) never read as measured here
    vidur = P.produced("calibration.gpu", empty)
    assert vidur.tag() == "predicted + measured on a GPU (Vidur profiles)"
    assert not vidur.measured


def test_a_sweep_must_declare_known_kinds_at_registration() -> None:
    from kvbench.suites.bench import registry
    from kvbench.workloads.errors import ConfigError

    def measure(case: dict, ctx: object) -> list[registry.Measurement]:
        return []

    for bad in ((), ("timed",), (P.MEASURED, P.MEASURED), (P.NOT_STATED,), [P.MEASURED]):
        with pytest.raises(ConfigError, match=r"test\.undeclared"):
            registry.sweep("test.undeclared", "d", lambda full: [], produced=bad)(measure)  # type: ignore[arg-type]
    assert "test.undeclared" not in {s.name for s in registry.all_sweeps()}


def test_end_to_end_errors_read_as_computed_not_timed() -> None:
    """The e2e sweeps compute logit errors and token agreement; nothing in them is
    timed, so their pages say "computed here" on the run's device, never "timed"."""
    empty = pd.DataFrame({"metric": ["logit_error_max"], "value": [1e-6]})
    for suite in ("e2e.llama_fp8", "e2e.kv_specs"):
        made = P.produced(suite, empty)
        assert made.tag() == "computed here (CPU)"
        assert "nothing timed" in made.sentence()
        assert "timed on this machine" not in made.sentence()
        assert not made.measured


def test_debug_columns_sit_in_details_and_parameters_carry_units(site: Path) -> None:
    page = (site / "sweep-kernel.decode.html").read_text()
    main, _, details = page.partition("<details>")
    assert "<th>time_paged</th>" in main and "<th>kernel_path_is_cpp</th>" not in main
    assert "<th>kernel_path_is_cpp</th>" in details
    assert "<th>ctx_len [tokens]</th>" in main
    rate = (site / "sweep-serving.rate.html").read_text()
    assert "<th>rate [requests/s]</th>" in rate


def test_every_registered_sweep_names_its_kinds() -> None:
    """Every sweep the bench registers declares its kinds, and a sweep old results files
    know by the legacy table declares the same kinds (an old run and a new one of the same
    sweep read alike)."""
    import kvbench.suites.bench.catalog  # noqa: F401  (registers every sweep)
    from kvbench.suites.bench import registry

    names = {  # the project's sweeps (other tests register toy ones)
        s.name
        for s in registry.all_sweeps()
        if s.measure.__module__.startswith("kvbench.suites.bench.sweeps.")
    }
    assert names, "no sweep registered"
    for sweep in registry.all_sweeps():
        if sweep.name in names:
            assert sweep.produced, sweep.name
            assert sweep.produced == P.LEGACY_KINDS.get(sweep.name, sweep.produced), sweep.name


def _captions(page: Path) -> list[str]:
    return [
        " ".join(html.unescape(re.sub(r"<[^>]+>", "", c)).split())
        for c in re.findall(r"<figcaption[^>]*>(.*?)</figcaption>", page.read_text(), re.S)
    ]


def test_each_figure_of_a_mixed_sweep_says_what_it_draws(site: Path) -> None:
    """trace.serving is modeled + measured; its modeled views' captions say modeled only
    (with the profile, never the device), its measured replay's says measured only."""
    captions = _captions(site / "sweep-trace.serving.html")
    goodput = [c for c in captions if c.startswith("Goodput")]
    replay = [c for c in captions if c.startswith("Engine replay time")]
    assert len(goodput) == 1 and len(replay) == 1, captions
    assert "· modeled (8xh100-tp8)" in goodput[0] and "measured" not in goodput[0]
    assert "· measured here (CPU)" in replay[0] and "modeled" not in replay[0]
    assert "Produced by: modeled (8xh100-tp8)" in _text(site / "sweep-trace.serving.html")


def test_figure_kinds_are_among_their_sweeps() -> None:
    """A figure's own kinds are a part of its sweep's (`Produced.only` refuses others),
    and every figure of trace.serving names exactly one (its views are one kind each)."""
    import kvbench.suites.bench.catalog  # noqa: F401  (registers every sweep)
    from kvbench.reports.figure_specs import SPECS
    from kvbench.suites.bench import registry

    for spec in SPECS:
        assert set(spec.kinds) <= set(registry.get_sweep(spec.suite).produced), spec.title
        if spec.suite == "trace.serving":
            assert len(spec.kinds) == 1, spec.title
    with pytest.raises(ValueError, match="not among the sweep's"):
        P.Produced((P.MODELED,)).only((P.MEASURED,))
