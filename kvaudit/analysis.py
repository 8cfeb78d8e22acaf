"""Running the named queries of `queries/` over a store or a backend, with their variables set.

Queries take their parameters as DuckDB variables (`getvariable('kvaudit_...')` with a
default), so the same file runs from the `duckdb` shell after `SET VARIABLE`, from
`kvaudit sql -f`, and from here, on DuckDB or translated for ClickHouse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvaudit.backends import Source, as_backend
from kvaudit.named_queries import load


def run_named(
    source: Source, name: str, variables: Mapping[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of the named query `name` (e.g. `hit_rate`)."""
    return as_backend(source).query(load(name), variables)
