"""The named queries of `queries/`: found wherever kvaudit is installed, and run with their variables set.

Queries take their parameters as DuckDB variables (`getvariable('kvaudit_...')` with a
default), so the same file runs from the `duckdb` shell after `SET VARIABLE`, from
`kvaudit sql -f`, and from here, on DuckDB or translated for ClickHouse.

A query may build on another rather than repeat it: a header line `-- Includes: NAME AS
cte` makes the named query NAME a CTE of that name in front of it (`reuse_left` sums up
the pages of `explain` so). `load` returns the query with its includes in place.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Final

from kvaudit.backends import as_backend

if TYPE_CHECKING:
    from kvaudit.backends import Source


def query_path(name: str) -> Traversable:
    """The file of a named query, e.g. `summary` or `audit/kva001`.

    Raises:
        FileNotFoundError: no such query.
    """
    path = files("kvaudit.queries").joinpath(*f"{name.removesuffix('.sql')}.sql".split("/"))
    if not path.is_file():
        raise FileNotFoundError(f"no named query {name!r}")
    return path


def load(name: str) -> str:
    """The SQL of a named query, with the queries it includes as CTEs in front of it."""
    text = query_path(name).read_text()
    includes = _INCLUDE.findall(text)
    if not includes:
        return text
    ctes = ",\n".join(f"{alias} AS (\n{load(included).strip().rstrip(';')}\n)" for included, alias in includes)
    lines = text.strip().rstrip(";").splitlines()
    header = list(itertools.takewhile(lambda line: line.startswith("--") or not line.strip(), lines))
    body = "\n".join(lines[len(header) :])
    # The query's own WITH continues the list of CTEs.
    if body[:5].upper() == "WITH ":
        return "\n".join([*header, f"WITH {ctes},", body[5:]])
    return "\n".join([*header, f"WITH {ctes}", body])


# Folders whose queries are parts of something else (the auditor's rules, the TUI's panels),
# not questions a user asks.
PARTS: Final = ("audit/", "tui/")
_INCLUDE: Final = re.compile(r"^-- Includes: ([\w/]+) AS (\w+)$", re.MULTILINE)
_VARIABLE: Final = re.compile(r"getvariable\('(kvaudit_\w+)'\)(?:\s*,\s*([^)]+)\))?")


@dataclass(frozen=True)
class QueryInfo:
    """What `kvaudit queries` lists of a named query, read from its file."""

    name: str
    summary: str  # the first line of its header comment, after `name:`
    parameters: dict[str, str | None]  # variable -> its default as written in the SQL (None: unset)


def describe(name: str) -> QueryInfo:
    """A named query's one-line summary and the variables it reads, with their defaults."""
    text = load(name)
    first = text.splitlines()[0] if text else ""
    summary = first.removeprefix("--").strip().removeprefix(f"{name}:").strip()
    parameters: dict[str, str | None] = {}
    for variable, default in _VARIABLE.findall(text):
        if default or variable not in parameters:
            parameters[variable] = default.strip() or None
    return QueryInfo(name, summary, parameters)


def variables_read(sql: str) -> set[str]:
    """The `kvaudit_` variables a query reads (its parameters)."""
    return {variable for variable, _ in _VARIABLE.findall(sql)}


def resolve(spec: str) -> str | None:
    """The named query a `-f` argument means when no such file exists, or None.

    `summary`, `summary.sql`, `queries/summary.sql` and `evictions/rates` all name the
    packaged queries, so the README's examples work from a pip install too.
    """
    path = PurePosixPath(spec.removesuffix(".sql"))
    parts = path.parts[1:] if path.parts[:1] == ("queries",) else path.parts
    name = "/".join(parts)
    return name if name and name in named_queries() else None


def named_queries() -> list[str]:
    """Names of the named queries shipped with kvaudit, e.g. `summary`, `audit/kva001_...`."""
    return sorted(_walk(files("kvaudit.queries"), ""))


def _walk(folder: Traversable, prefix: str) -> Iterator[str]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _walk(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".sql"):
            yield prefix + entry.name.removesuffix(".sql")


def run_named(
    source: Source, name: str, variables: Mapping[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of the named query `name` (e.g. `hit_rate`)."""
    return as_backend(source).query(load(name), variables)
