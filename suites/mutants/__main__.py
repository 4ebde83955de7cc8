"""`python -m kvbench.suites.mutants`: the mutation session (see `run.main`)."""

from kvbench.suites.mutants.run import main

raise SystemExit(main())
