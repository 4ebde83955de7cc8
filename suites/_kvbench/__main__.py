"""`python -m kvbench` runs the kvbench command line."""

from kvbench.suites.cli import main

raise SystemExit(main())
