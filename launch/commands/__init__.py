"""One module per `bertpipe` subcommand: `add_arguments(parser)` and `run(args) -> int`. Keep them thin."""
