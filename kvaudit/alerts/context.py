"""What a rule's SQL can use besides the kvaudit views.

- `recent(ts, INTERVAL 10 MINUTE)`: `ts` lies within that long before the newest span.
  Windows end at the newest span rather than at the wall clock, so a rule means the
  same over a live trace directory and over last week's files.
- Each parameterless named query as a temporary view `query_<name>` (`/` in a name
  becomes `_`: `queries/summary.sql` is `query_summary`).

Temporary objects live in the connection only, so this works over a read-only
ingested database too, and never changes what the database holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Final

import duckdb

from kvaudit.named_queries import load

logger = logging.getLogger(__name__)

PREFIX: Final = "query_"


def prepare(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or refresh) the macro and the views of the named queries on this connection."""
    con.execute("CREATE OR REPLACE TEMP MACRO recent(ts, span) AS ts > (SELECT max(end_time) FROM spans) - span")
    for name in named_queries():
        view = PREFIX + name.replace("/", "_")
        try:
            con.execute(f'CREATE OR REPLACE TEMP VIEW "{view}" AS {load(name).strip().rstrip(";")}')
        except duckdb.Error as exc:
            # A query with parameters cannot be a view; rules cannot use it.
            logger.debug("named query %s is not usable as view %s: %s", name, view, exc)


def named_queries() -> list[str]:
    """Names of the named queries shipped with kvaudit, e.g. `summary`, `audit/kva001_...`."""
    return sorted(_walk(files("kvaudit.queries"), ""))


def _walk(folder: Traversable, prefix: str) -> Iterator[str]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _walk(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".sql"):
            yield prefix + entry.name.removesuffix(".sql")
