"""The measuring side of the regression gate (`kvbench gate`, `nox -s gate`).

`timing` measures same-run timing ratios (paged kernel vs a contiguous reference on the
same KV, repeats interleaved); `static` collects the ahead-of-time compile costs of every
kernel configuration; `conformance` checks the kernels against the float64 oracle (a run
that fails it cannot become a baseline); `run` writes all of it as one results run that
`reports.gate` compares with the committed baselines.
"""
