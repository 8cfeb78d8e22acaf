"""One rule's SQL over the kvaudit views, as labelled samples.

A row is one alerting instance: its non-numeric columns are labels (NULL leaves the
label out), its `value` column the sample value. Whether a column is numeric is
decided by its SQL type, not by the values of one evaluation, so an instance keeps
the same labels whatever its data.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import duckdb

from kvaudit.alerts.rules import ALERTNAME, NAME, Rule

VALUE: Final = "value"
_NUMERIC: Final = frozenset(
    {
        "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
        "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT",
        "FLOAT", "DOUBLE",
    }
)  # fmt: skip


class EvaluationError(Exception):
    """A rule whose result cannot become alerts (bad columns, repeated label sets)."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float | None


@dataclass(frozen=True)
class Columns:
    """How a rule's result columns map onto labels and the value."""

    labels: tuple[str, ...]
    value: str | None
    ignored: tuple[str, ...]  # numeric columns other than `value`

    def problems(self) -> list[str]:
        """What makes the columns unusable as alerts (empty when fine)."""
        problems = [
            f"column {name!r} cannot be a label name"
            for name in self.labels
            if not NAME.fullmatch(name) or name.startswith("__") or name == ALERTNAME
        ]
        problems += [
            f"numeric column {name!r} would be ignored: name it {VALUE!r}, or cast it to VARCHAR to make it a label"
            for name in self.ignored
        ]
        if len(set(self.labels)) != len(self.labels):
            problems.append("two columns have the same name")
        return problems


def classify(relation: duckdb.DuckDBPyRelation) -> Columns:
    """Labels, value and ignored columns of a query's result, from its SQL types.

    Raises:
        EvaluationError: the `value` column is not numeric.
    """
    labels, ignored, value = [], [], None
    for name, type_ in zip(relation.columns, relation.types):
        numeric = _is_numeric(str(type_))
        if name == VALUE:
            if not numeric:
                raise EvaluationError(f"column {VALUE!r} must be numeric, not {type_}")
            value = name
        elif numeric:
            ignored.append(name)
        else:
            labels.append(name)
    return Columns(tuple(labels), value, tuple(ignored))


def _is_numeric(type_name: str) -> bool:
    return type_name in _NUMERIC or type_name.startswith("DECIMAL")


def relation(con: duckdb.DuckDBPyConnection, rule: Rule) -> duckdb.DuckDBPyRelation:
    """The rule's query, bound against the views but not run.

    Raises:
        duckdb.Error: it does not parse or names something that does not exist.
        EvaluationError: it is not a query.
    """
    result = con.sql(rule.expr)
    if result is None:
        raise EvaluationError("expr is a statement, not a query")
    return result


def evaluate_rule(con: duckdb.DuckDBPyConnection, rule: Rule) -> list[Sample]:
    """The samples of one evaluation of a rule.

    Raises:
        duckdb.Error: the SQL failed.
        EvaluationError: the result cannot become alerts.
    """
    result = relation(con, rule)
    columns = classify(result)
    problems = columns.problems()
    if problems:
        raise EvaluationError("; ".join(problems))
    positions = [result.columns.index(name) for name in columns.labels]
    value_at = result.columns.index(columns.value) if columns.value else None
    samples: list[Sample] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for row in result.fetchall():
        labels = {name: _label_value(row[i]) for name, i in zip(columns.labels, positions) if row[i] is not None}
        identity = tuple(sorted(labels.items()))
        if identity in seen:
            raise EvaluationError(f"two rows have the same labels {dict(identity)}: add a column that tells them apart")
        seen.add(identity)
        value = row[value_at] if value_at is not None else None
        samples.append(Sample(labels, None if value is None else float(value)))
    return samples


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)
