"""One module per `kvaudit` subcommand (see `kvaudit.cli.COMMANDS`), and `arguments`, what they share.

The one stage that may import every other (never `kvaudit.cli`, which imports it).
"""
