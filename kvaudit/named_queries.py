"""The named `.sql` files of `queries/`, found wherever kvaudit is installed."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable


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
