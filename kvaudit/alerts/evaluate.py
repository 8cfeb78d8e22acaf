"""One rule's SQL over the kvaudit views of a backend, as labelled samples.

A row is one alerting instance: its non-numeric columns are labels (NULL leaves the
label out), its `value` column the sample value. Whether a column is numeric is
decided by its SQL type, not by the values of one evaluation, so an instance keeps
the same labels whatever its data.

A rule is SQL kvaudit did not write: it runs in the backend's sandbox (`Backend.sandboxed`:
one query, reading the views and nothing else), stopped after a time limit, and may
produce a limited number of alerts (Prometheus' `limit`): past it the evaluation fails
and the rule's alerts stay as they were, rather than flooding the state file and the
notifiers.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from kvaudit.alerts.bounds import Bounds
from kvaudit.alerts.labels import ALERTNAME, NAME
from kvaudit.alerts.rules import Rule
from kvaudit.backends import Backend
from kvaudit.errors import InputError

VALUE: Final = "value"


class EvaluationError(InputError):
    """A rule whose result cannot become alerts (bad columns, repeated label sets)."""


@dataclass(frozen=True)
class Sample:
    """One row of a rule's result; `annotations`: set by whoever made the sample, beside the rule's templates."""

    labels: dict[str, str]
    value: float | None
    annotations: dict[str, str] = field(default_factory=dict)


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


def classify(schema: pa.Schema) -> Columns:
    """Labels, value and ignored columns of a query's result, from its column types.

    Raises:
        EvaluationError: the `value` column is not numeric.
    """
    labels, ignored, value = [], [], None
    for column in schema:
        numeric = _is_numeric(column.type)
        if column.name == VALUE:
            if not numeric:
                raise EvaluationError(f"column {VALUE!r} must be numeric, not {column.type}")
            value = column.name
        elif numeric:
            ignored.append(column.name)
        else:
            labels.append(column.name)
    return Columns(tuple(labels), value, tuple(ignored))


def _is_numeric(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)


def result(backend: Backend, rule: Rule, bounds: Bounds) -> pa.Table:
    """The rows of the rule's query over the backend, in its sandbox: at most `bounds.limit` + 1.

    Raises:
        QueryTimeoutError: it ran past `bounds.timeout_s`.
        BackendError: it is not one query, or failed.
    """
    return backend.sandboxed(rule.expr, timeout_s=bounds.timeout_s, max_rows=bounds.limit + 1)


def evaluate_rule(backend: Backend, rule: Rule, bounds: Bounds) -> list[Sample]:
    """The samples of one evaluation of a rule.

    Raises:
        QueryTimeoutError: the query ran past `bounds.timeout_s`.
        BackendError: the SQL failed.
        EvaluationError: the result cannot become alerts, or would be more than `bounds.limit`.
    """
    table = result(backend, rule, bounds)
    if table.num_rows > bounds.limit:
        raise EvaluationError(f"more than {bounds.limit} alerts (the limit of its group, `limit`)")
    columns = classify(table.schema)
    problems = columns.problems()
    if problems:
        raise EvaluationError("; ".join(problems))
    labels = {name: table.column(name).to_pylist() for name in columns.labels}
    values = table.column(columns.value).to_pylist() if columns.value else [None] * table.num_rows
    samples: list[Sample] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for row, value in enumerate(values):
        sample = {name: _label_value(column[row]) for name, column in labels.items() if column[row] is not None}
        identity = tuple(sorted(sample.items()))
        if identity in seen:
            raise EvaluationError(f"two rows have the same labels {dict(identity)}: add a column that tells them apart")
        seen.add(identity)
        samples.append(Sample(sample, None if value is None else float(value)))
    return samples


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)
