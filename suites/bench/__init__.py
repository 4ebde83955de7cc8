"""The bench suite: named sweeps over block sizes, sequence lengths and batch sizes.

A sweep is a function registered by name (`registry.sweep`) that lists its cases and
measures one case at a time; the runner (`runner.run_bench`) appends every case's
measurements to the results store as soon as they are taken, so a killed run keeps
all finished cases and `--resume RUN` measures only the rest. `kvbench bench` and
`nox -s bench` drive it.

The sweep modules live in `suites.bench.sweeps`; importing `suites.bench.catalog`
registers all of them.
"""
