"""`python -m suites` runs the kvbench CLI."""

from suites.cli import main

raise SystemExit(main())
