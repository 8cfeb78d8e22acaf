"""The output formats of query results and how many rows a table shows.

A module of its own so that the command line's parser, which offers them, needs no Rich.
"""

from typing import Final

FORMATS: Final = ("table", "csv", "json")
# Rows a table shows unless asked for more (`--limit N`, `--all`): a person reads the
# first screens, and Rich lays out ~5,000 rows a second (174k rows took 37 s).
TABLE_ROWS: Final = 200
