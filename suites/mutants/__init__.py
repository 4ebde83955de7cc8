"""kvbench's own mutation check (`nox -s mutants`; docs/mutants.md).

A fixed, hand-written list of mutants (`catalog`: a file, an exact snippet that occurs
once, its replacement, why it is a meaningful defect, and the conformance tests that
should catch it) is applied one at a time to a copy of the working tree; each copy runs
only its mutant's tests, importing the copy (`guard` proves that it does, and a canary
mutant must be killed), and the session reports killed / survived / timeout per mutant
(`run`). The real tree is never modified. Not part of CI: it takes tens of minutes.
"""
