"""A fetched page descriptor beside the stored one of the same key, field by field."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend
from kvaudit.contract import PageDescriptor
from kvaudit.tui.findings import FindingRow

# The descriptor fields in the contract's order; the `pages` view names its columns alike.
DESCRIPTOR_FIELDS: Final = PageDescriptor.__struct_fields__
_QUERY: Final = load("tui/descriptors")
_FETCHED, _STORED = "fetched", "stored"


class Mark(StrEnum):
    """How the two sides of one field compare."""

    NAMED = "named"  # the finding names the field (it may differ from the consumer, not the store)
    DIFFERS = "differs"  # both sides present and unequal, not named by the finding
    ABSENT = "absent"  # present on one side only (a fetch carries `used`, a store does not)
    SAME = "same"


@dataclass(frozen=True)
class FieldRow:
    name: str
    fetched: Any
    stored: Any
    mark: Mark


@dataclass(frozen=True)
class DescriptorPair:
    """Both sides of a finding's page; a side is None when the traces hold no such page."""

    fetched: dict[str, Any] | None
    stored: dict[str, Any] | None
    rows: tuple[FieldRow, ...]

    @property
    def differing(self) -> tuple[str, ...]:
        return tuple(row.name for row in self.rows if row.mark in (Mark.NAMED, Mark.DIFFERS))


def descriptor_pair(backend: Backend, finding: FindingRow, *, skew_s: float) -> DescriptorPair:
    """The descriptors behind `finding`: its fetch (by span and key) and the producer's store."""
    sides: dict[str, dict[str, Any]] = {}
    if finding.span_id is not None and finding.key is not None:
        params = {"kvaudit_span_id": finding.span_id, "kvaudit_key": finding.key, "kvaudit_skew_ns": int(skew_s * 1e9)}
        columns, rows = backend.query(_QUERY, params)
        sides = {row[0]: dict(zip(columns, row)) for row in rows}
    fetched, stored = sides.get(_FETCHED), sides.get(_STORED)
    return DescriptorPair(fetched, stored, compare(fetched, stored, named=frozenset(finding.fields)))


def compare(
    fetched: dict[str, Any] | None, stored: dict[str, Any] | None, *, named: frozenset[str]
) -> tuple[FieldRow, ...]:
    """Field rows of two descriptor rows, each marked by how its two sides compare."""
    rows = []
    for name in DESCRIPTOR_FIELDS:
        left = _value(fetched, name)
        right = _value(stored, name)
        if left is None and right is None and name not in named:
            continue
        if name in named:
            mark = Mark.NAMED
        elif left is not None and right is not None and left != right:
            mark = Mark.DIFFERS
        elif fetched is not None and stored is not None and (left is None) != (right is None):
            mark = Mark.ABSENT
        else:
            mark = Mark.SAME
        rows.append(FieldRow(name, left, right, mark))
    return tuple(rows)


def _value(row: dict[str, Any] | None, name: str) -> Any:
    value = None if row is None else row.get(name)
    return tuple(value) if isinstance(value, list) else value
