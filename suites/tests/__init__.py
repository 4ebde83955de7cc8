"""Tests of kvbench's own tooling (packaging, CLI, results store, site, gate logic), laid out
like the packages they test. The conformance suite (`suites/conformance`) keeps conformance:
caches against the reference, kernels against the oracle, peers, the end-to-end model check."""
