"""The mutation session's list cannot rot silently: every mutant's snippet occurs exactly
once in this tree, its tests exist, the list is long enough and covers every layer it
promises (the session itself, `nox -s mutants`, is run by people, not CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.suites.mutants import guard, run
from kvbench.suites.mutants.catalog import MUTANTS
from kvbench.suites.mutants.model import CANARY, Mutant, defined_tests, problems
from kvbench.suites.typecheck import package_dirs

ROOT = Path(__file__).resolve().parents[4]


def test_every_mutant_fits_this_tree() -> None:
    assert problems(MUTANTS, ROOT) == []


def test_the_list_is_long_and_covers_every_layer() -> None:
    assert len(MUTANTS) >= 40
    files = [m.file for m in MUTANTS]
    for folder in ("paged/", "reference/", "kernels/", "workloads/"):
        assert sum(f.startswith(folder) for f in files) >= 3, folder
    cpp = [m for m in MUTANTS if m.is_cpp]
    assert 2 <= len(cpp) <= 4  # each one rebuilds the C++ extension (minutes)
    assert any(f == "kernels/triton_kernels.py" for f in files)
    assert any(f == "workloads/trace_import.py" for f in files)
    assert any(f == "paged/hitrate.py" for f in files)
    assert MUTANTS[0].id == CANARY and not MUTANTS[0].equivalent
    assert all(not m.equivalent or len(m.equivalent) > 20 for m in MUTANTS)


def test_problems_name_what_is_wrong(tmp_path: Path) -> None:
    bad = [
        Mutant("a", "paged/cache.py", "no such snippet", "x", "r", ("suites/nope.py",)),
        Mutant("a", "suites/cli/x.py", "y", "y", "two\nlines", ()),
        Mutant("b", "paged/block_pool.py", "self", "x", "r",
               ("suites/conformance/test_paged_block_pool.py::test_missing",)),
    ]  # fmt: skip
    found = "\n".join(problems(bad, ROOT))
    for text in ("occurs 0 times", "duplicate id", "not under", "equals the original",
                 "one line", "no tests", "no test file suites/nope.py",
                 "no test function test_missing", "occurs", "canary"):  # fmt: skip
        assert text in found, text


def test_test_names_include_state_machines_assigned_to_a_name() -> None:
    names = defined_tests(ROOT / "suites/conformance/test_paged_hybrid.py")
    assert "test_hybrid_and_cross_attention_paged_vs_reference" in names  # Machine.TestCase
    assert "test_hybrid_gemma_like_groups_share_one_pool" in names


def test_apply_refuses_a_snippet_that_is_not_unique() -> None:
    m = Mutant("a", "f.py", "x = 1", "x = 2", "r", ("t.py",))
    assert m.apply("y\nx = 1\n") == "y\nx = 2\n"
    with pytest.raises(ValueError, match="2 times"):
        m.apply("x = 1\nx = 1\n")


def test_module_names_follow_the_package_dir_mapping() -> None:
    mapping = {k: str(v.relative_to(ROOT)) for k, v in package_dirs(ROOT).items()}
    assert guard.module_name("paged/cache.py", mapping) == "kvbench.paged.cache"
    assert guard.module_name("paged/serving/engine/__init__.py", mapping) == (
        "kvbench.paged.serving.engine"
    )
    assert guard.module_name("suites/_kvbench/__init__.py", mapping) == "kvbench"
    with pytest.raises(ValueError, match="no package"):
        guard.module_name("noxfile.py", mapping)


def test_the_guard_refuses_a_run_that_imports_another_tree(tmp_path: Path) -> None:
    """This process imports kvbench from the checkout, not from `tmp_path`: a mutation
    run there would test unmutated code, and the guard must say so (MISWIRED)."""
    (tmp_path / guard.MARKER).write_text(
        json.dumps({"id": "m", "file": "paged/cache.py", "replacement": "zzz",
                    "package_dir": {"kvbench.paged": "paged"}}),
        encoding="utf-8",
    )  # fmt: skip
    (tmp_path / "paged").mkdir()
    (tmp_path / "paged" / "cache.py").write_text("zzz\n", encoding="utf-8")
    code, found = guard.check(tmp_path)
    assert code == guard.MISWIRED
    assert any("kvbench is imported from" in p for p in found), found


def test_outcomes_and_the_score() -> None:
    assert [run.classify(c) for c in (0, 1, None, 2, guard.MISWIRED, guard.STILLBORN)] == [
        "survived", "killed", "timeout", "error", "miswired", "stillborn",
    ]  # fmt: skip
    rows = [
        run.Outcome(CANARY, "f", "r", "killed", 1.0, 1, "", [], [], ""),
        run.Outcome("b", "f", "r", "survived", 1.0, 0, "", [], [], ""),
        run.Outcome("c", "f", "r", "survived", 1.0, 0, "no test can tell them apart", [], [], ""),
    ]
    summary = run.summarize(rows)
    assert summary["score"] == 0.5 and summary["equivalent"] == 1
    assert summary["canary"] == "killed"
    assert "| b | f | survived |" in run.table(rows)
    assert run.failures("x\nFAILED suites/a.py::test_b - boom\n") == ["suites/a.py::test_b"]
    text = "FAILED a.py::t[window smaller than a block-gather] - assert 1\nERROR b.py::u\n"
    assert run.failures(text) == ["a.py::t[window smaller than a block-gather]", "b.py::u"]
