"""One module per `kvaudit` subcommand (see `kvaudit.cli.COMMANDS`)."""
