"""What a mutant is, and the checks that keep the list honest (snippets that occur exactly
once, tests that exist), shared by the runner, the guard and the tooling test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The id of the mutant that must be killed in every session: it proves the tests import
#: the mutated copy (an editable install elsewhere would test unmutated code and let it live).
CANARY = "canary.block_pool.num_used"

#: Folders mutants may touch (the code under test, not the tests or the tooling).
MUTABLE_ROOTS = ("paged/", "reference/", "kernels/", "workloads/")


@dataclass(frozen=True)
class Mutant:
    """One hand-written defect.

    Attributes:
        id: unique, dotted (`<area>.<module>.<what>`).
        file: the file it changes, relative to the repository root.
        original: an exact snippet that occurs exactly once in `file`.
        replacement: what replaces it (must differ).
        reason: one line: the real defect it stands for.
        tests: pytest node ids or test files (relative to the root) that should kill it.
        k: an optional pytest `-k` expression narrowing `tests`.
        timeout: seconds before the run counts as a timeout (None: the session default;
            C++ mutants need the build's minutes on top).
        equivalent: where the mutant cannot be told apart from the original by any test,
            why (it then does not count towards the score); "" otherwise.
    """

    id: str
    file: str
    original: str
    replacement: str
    reason: str
    tests: tuple[str, ...]
    k: str | None = None
    timeout: float | None = None
    equivalent: str = ""

    @property
    def is_cpp(self) -> bool:
        """A mutant of the C++ kernel: the copy must rebuild the extension."""
        return self.file.endswith((".cpp", ".h"))

    def apply(self, text: str) -> str:
        """`text` with the snippet replaced (ValueError unless it occurs exactly once)."""
        count = text.count(self.original)
        if count != 1:
            raise ValueError(
                f"mutant {self.id}: the snippet occurs {count} times in {self.file}, not once: "
                f"{self.original!r:.120}"
            )
        return text.replace(self.original, self.replacement)


_TEST_DEF = re.compile(
    r"^(?:\s*(?:async\s+)?def\s+(test\w*)\s*\(|class\s+(Test\w*)\b|([Tt]est\w*)\s*=)",
    re.MULTILINE,
)


def defined_tests(path: Path) -> set[str]:
    """Names of the tests a test file defines (functions, classes, and test cases assigned
    from a hypothesis state machine), read as text: nothing is imported."""
    found = _TEST_DEF.findall(path.read_text(encoding="utf-8"))
    return {name for groups in found for name in groups if name}


def problems(mutants: list[Mutant], root: Path) -> list[str]:
    """Everything wrong with a mutant list against the tree at `root` ([] when sound):
    duplicate ids, files outside the code under test, snippets that do not occur exactly
    once or replacements equal to them, and test ids that name no file or function."""
    out: list[str] = []
    seen: set[str] = set()
    defs: dict[str, set[str]] = {}
    for m in mutants:
        if m.id in seen:
            out.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        if not m.file.startswith(MUTABLE_ROOTS):
            out.append(f"{m.id}: {m.file} is not under {', '.join(MUTABLE_ROOTS)}")
        path = root / m.file
        if not path.is_file():
            out.append(f"{m.id}: no file {m.file}")
        else:
            count = path.read_text(encoding="utf-8").count(m.original)
            if count != 1:
                out.append(f"{m.id}: snippet occurs {count} times in {m.file}: {m.original!r:.80}")
        if m.replacement == m.original:
            out.append(f"{m.id}: the replacement equals the original")
        if not m.reason.strip() or "\n" in m.reason:
            out.append(f"{m.id}: the reason must be one line")
        if not m.tests:
            out.append(f"{m.id}: no tests")
        for node in m.tests:
            file, _, rest = node.partition("::")
            test_file = root / file
            if not test_file.is_file():
                out.append(f"{m.id}: no test file {file}")
                continue
            if rest:
                name = rest.split("::")[0].split("[")[0]
                if file not in defs:
                    defs[file] = defined_tests(test_file)
                if name not in defs[file]:
                    out.append(f"{m.id}: no test function {name} in {file}")
    if CANARY not in seen:
        out.append(f"the canary mutant {CANARY} is missing")
    return out
