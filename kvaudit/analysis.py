"""Running the named queries of `queries/` over a store, with their DuckDB variables set.

Queries take their parameters as DuckDB variables (`getvariable('kvaudit_...')` with a
default), so the same file runs from the `duckdb` shell after `SET VARIABLE`, from
`kvaudit sql -f`, and from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvaudit.named_queries import load
from kvaudit.store import TraceStore


def set_variables(store: TraceStore, variables: Mapping[str, Any]) -> None:
    """Set (or, for None, reset) DuckDB variables on the store's connection."""
    for name, value in variables.items():
        if not name.isidentifier():
            raise ValueError(f"bad variable name {name!r}")
        if value is None:
            store.con.execute(f"RESET VARIABLE {name}")
        else:
            store.con.execute(f"SET VARIABLE {name} = ?", [value])


def run_named(
    store: TraceStore, name: str, variables: Mapping[str, Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of the named query `name` (e.g. `hit_rate`)."""
    set_variables(store, variables or {})
    return store.query(load(name))
