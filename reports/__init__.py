"""Reports: results store -> pandas tables -> matplotlib figures -> HTML site, and the
regression gate. Reads result files; never imports `paged` or `kernels`."""
