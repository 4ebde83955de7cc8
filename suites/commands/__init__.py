"""One module per `kvbench` subcommand; each defines `register(subparsers)`."""
