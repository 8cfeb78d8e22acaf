"""The output formats of query results and how many rows a table shows.

A module of its own so that the command line's parser, which offers them, needs no Rich.
"""

from typing import Final

FORMATS: Final = ("table", "csv", "json")
# Rows a table shows unless asked for more (`--limit N`, `--all`): a person reads the
# first screens, and Rich lays a table out row by row, far slower than a query makes rows.
TABLE_ROWS: Final = 200
