"""`kvaudit alerts check`: every problem of rule files, one `file:line: problem` each.

Beyond what loading finds (YAML, unknown keys, durations, templates), each rule's
SQL is bound and run against the kvaudit views over an empty trace set: that finds
syntax errors, unknown tables and columns, and results that cannot become alerts,
before any trace exists. It runs as evaluation runs it, in the backend's sandbox
(`Backend.sandboxed`): a statement that is not one query is refused unrun, and a query
that would read a file, reach the network or load an extension fails there; checking
a rule file changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kvaudit.alerts.bounds import Bounds
from kvaudit.alerts.engine import RULE_WINDOW_S
from kvaudit.alerts.evaluate import EvaluationError, classify, result
from kvaudit.alerts.rules import Problem, Rule, read_rule_files
from kvaudit.analyse.derived_views import prepare
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends import Backend, BackendError
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.store import TraceStore

_SQL_LINE: Final = re.compile(r"^LINE (\d+):", re.MULTILINE)
# Binder and catalog errors carry no line, but name what they did not find.
_UNKNOWN_NAME: Final = re.compile(r'Referenced column "([^"]+)"|with name "?([^"\s]+?)"? does not exist')


def check_files(paths: Iterable[str | Path], bounds: Bounds | None = None) -> list[Problem]:
    """All problems of the rule files, in file and line order (empty when they are fine).

    Args:
        bounds: each rule's time limit (its alert limit does not apply over no traces).

    Raises:
        InputError: a file cannot be read.
    """
    groups, problems = read_rule_files(paths)
    with DuckDBBackend(TraceStore()) as backend:
        reads = [rule.expr for group in groups for rule in group.rules]
        prepare(backend, reads, audit=LiveAudit(), window_s=RULE_WINDOW_S)
        for group in groups:
            for rule in group.rules:
                problems.extend(check_rule(backend, rule, bounds or Bounds()))
    return sorted(problems, key=lambda p: (p.file, p.line))


def check_rule(backend: Backend, rule: Rule, bounds: Bounds) -> list[Problem]:
    """What is wrong with a rule's SQL and the templates that use its columns."""
    try:
        columns = classify(result(backend, rule, bounds).schema)
    except BackendError as exc:
        return [Problem(rule.file, _error_line(rule, exc.detail), _sql_error(exc.detail))]
    except EvaluationError as exc:
        return [Problem(rule.file, rule.expr_line, f"expr: {exc}")]
    problems = [Problem(rule.file, rule.expr_line, f"expr: {p}") for p in columns.problems()]
    for what, templates in (("labels", rule.labels), ("annotations", rule.annotations)):
        for key, template in templates.items():
            for label in sorted(template.labels - set(columns.labels)):
                problems.append(
                    Problem(rule.file, template.line, f"{what}.{key}: $labels.{label} is not a column of expr's result")
                )
    return problems


def _error_line(rule: Rule, text: str) -> int:
    """The file line a DuckDB error points at: its own `LINE n`, or the first SQL line naming what it lacks."""
    line = _SQL_LINE.search(text)
    if line:
        return rule.sql_line(int(line.group(1)))
    unknown = _UNKNOWN_NAME.search(text)
    if unknown:
        name = re.compile(rf"\b{re.escape(unknown.group(1) or unknown.group(2))}\b")
        for number, sql in enumerate(rule.expr.splitlines(), start=1):
            if name.search(sql):
                return rule.sql_line(number)
    return rule.expr_line


def _sql_error(text: str) -> str:
    """DuckDB's message without its echo of the SQL (which `file:line` already points at)."""
    head = text.split("\n\n", 1)[0]
    return "expr: " + " ".join(head.split())
