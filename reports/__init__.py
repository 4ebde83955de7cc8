"""Reports: results store -> pandas tables -> matplotlib figures -> HTML site, and the
committed gate baselines (reports/baselines/, data only: the gate's code is
`kvbench.suites.gate`). Reads result files; never imports `paged` or `kernels`."""
