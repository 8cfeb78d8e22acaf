"""The named queries of `queries/`: found wherever kvaudit is installed, and run with their variables set.

Queries take their parameters as DuckDB variables (`getvariable('kvaudit_...')` with a
default), so the same file runs from the `duckdb` shell after `SET VARIABLE`, from
`kvaudit sql -f`, and from here, on DuckDB or translated for ClickHouse.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any

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
    return query_path(name).read_text()


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
