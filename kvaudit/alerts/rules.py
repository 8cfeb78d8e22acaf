"""Rule files: Prometheus-shaped alerting rules whose `expr` is SQL over the kvaudit views.

    groups:
      - name: kvaudit
        interval: 30s
        limit: 100            # at most this many alerts per rule (default: the engine's, 1000)
        rules:
          - alert: KVAuditCriticalFinding
            expr: SELECT replica, count(*) AS value FROM pages WHERE ... GROUP BY replica
            for: 0s
            keep_firing_for: 10m
            labels: {severity: critical}
            annotations: {summary: "{{ $labels.replica }} used {{ $value }} malformed pages"}

The loader walks YAML nodes rather than loaded values so that every problem can name
its line, and it reports every problem it finds rather than stopping at the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvaudit.alerts.labels import ALERTNAME, NAME
from kvaudit.alerts.templates import Template, parse_template
from kvaudit.durations import parse_duration
from kvaudit.errors import InputError, user_files

# The group of kvaudit's own rule health alerts (`rule_health`): no rule file may use it.
HEALTH_GROUP: Final = "kvaudit-rule-health"
# What a rule file may say it is: kvaudit's SQL rules, which have Prometheus' shape but SQL in
# `expr`. Optional (files without it load); any other kind is refused, naming where such rules go.
SQL_RULES_KIND: Final = "kvaudit/sql-rules"
_FILE_KEYS: Final = frozenset({"kind", "groups"})
_GROUP_KEYS: Final = frozenset({"name", "interval", "limit", "rules"})
_RULE_KEYS: Final = frozenset({"alert", "expr", "for", "keep_firing_for", "labels", "annotations"})


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a rule file, printed as `file:line: message`."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class RuleFileError(InputError):
    """Rule files that do not load; `problems` lists all that was found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}; run `kvaudit alerts check`")


@dataclass(frozen=True)
class Rule:
    """One alerting rule.

    `expr_line` is the file line of the first line of the SQL; `expr_literal` tells
    whether SQL line n sits at file line `expr_line + n - 1` (a `|` block keeps lines).
    """

    alert: str
    expr: str
    for_s: float
    keep_firing_for_s: float
    labels: dict[str, Template]
    annotations: dict[str, Template]
    group: str
    file: str
    line: int
    expr_line: int
    expr_literal: bool

    def sql_line(self, sql_line: int) -> int:
        """The file line of a line of the SQL (1-based), as exactly as the YAML style allows."""
        return self.expr_line + sql_line - 1 if self.expr_literal else self.expr_line


@dataclass(frozen=True)
class Group:
    """A rule group; `limit`: the most alerts one of its rules may produce (None: the engine's default)."""

    name: str
    interval_s: float | None
    rules: tuple[Rule, ...]
    file: str
    line: int
    limit: int | None = None


def _default_pack() -> Traversable:
    return files("kvaudit.alerts").joinpath("pack", "default.yaml")


def default_pack_text() -> str:
    """The default rule pack shipped with kvaudit."""
    return _default_pack().read_text()


def load_default_pack() -> list[Group]:
    with as_file(_default_pack()) as path:
        return load_rules([path])


def load_rules(paths: Iterable[str | Path]) -> list[Group]:
    """Groups of rule files that load without problems.

    Raises:
        RuleFileError: any problem in any file.
        InputError: a file cannot be read.
    """
    groups, problems = read_rule_files(paths)
    if problems:
        raise RuleFileError(problems)
    return groups


def read_rule_files(paths: Iterable[str | Path]) -> tuple[list[Group], list[Problem]]:
    """Groups that loaded, and every problem found on the way (structure, names, durations, templates).

    Raises:
        InputError: a file cannot be read.
    """
    groups: list[Group] = []
    problems: list[Problem] = []
    for path in paths:
        reader = _Reader(str(path))
        with user_files():
            text = Path(path).read_text()
        for group in reader.read(text):
            # Alert state is kept by group name, so a name must mean one group across files.
            twin = next((g for g in groups if g.name == group.name), None)
            if twin is not None:
                reader.problems.append(
                    Problem(group.file, group.line, f"group {group.name!r} already defined at {twin.file}:{twin.line}")
                )
                continue
            groups.append(group)
        problems.extend(reader.problems)
    return groups, problems


class _Reader:
    """Turns one file's YAML nodes into groups, collecting problems with their lines."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def problem(self, node: Node, message: str) -> None:
        self.problems.append(Problem(self.file, node.start_mark.line + 1, message))

    def read(self, text: str) -> list[Group]:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 1
            self.problems.append(Problem(self.file, line, f"YAML: {exc.problem or exc.context}"))
            return []
        except yaml.YAMLError as exc:
            self.problems.append(Problem(self.file, 1, f"YAML: {exc}"))
            return []
        if root is None:
            return []  # an empty file has no groups, as in Prometheus
        top = self.mapping(root, "the rule file", _FILE_KEYS, required=("groups",))
        if top is not None and "kind" in top:
            kind = self.scalar(top["kind"], "kind")
            if kind is not None and kind != SQL_RULES_KIND:
                self.problem(
                    top["kind"],
                    f"kind {kind!r}: kvaudit reads {SQL_RULES_KIND} files (SQL in `expr`);"
                    " PromQL rules are Prometheus' (examples/prometheus/)",
                )
                return []
        if top is None or "groups" not in top:
            return []
        return [g for node in self.sequence(top["groups"], "groups") if (g := self.group(node)) is not None]

    def group(self, node: Node) -> Group | None:
        fields = self.mapping(node, "a group", _GROUP_KEYS, required=("name", "rules"))
        if fields is None or "name" not in fields:
            return None
        name = self.scalar(fields["name"], "name")
        if name == HEALTH_GROUP:
            self.problem(fields["name"], f"group name {name!r} is kvaudit's own (its rule health alerts)")
        interval = self.duration(fields["interval"], "interval") if "interval" in fields else None
        if interval == 0:
            self.problem(fields["interval"], "interval must be longer than 0s")
        limit = self.count(fields["limit"], "limit") if "limit" in fields else None
        rules: list[Rule] = []
        for rule_node in self.sequence(fields["rules"], "rules") if "rules" in fields else []:
            rule = self.rule(rule_node, name or "")
            if rule is None:
                continue
            # An alert is known by its group and name, in the state file too.
            twin = next((r for r in rules if r.alert == rule.alert), None)
            if twin is not None:
                self.problem(rule_node, f"alert {rule.alert!r} already defined in this group on line {twin.line}")
                continue
            rules.append(rule)
        if name is None:
            return None
        return Group(name, interval or None, tuple(rules), self.file, node.start_mark.line + 1, limit)

    def rule(self, node: Node, group: str) -> Rule | None:
        fields = self.mapping(node, "a rule", _RULE_KEYS, required=("alert", "expr"))
        if fields is None:
            return None
        alert = self.scalar(fields["alert"], "alert") if "alert" in fields else None
        if alert is not None and not NAME.fullmatch(alert):
            self.problem(fields["alert"], f"alert name {alert!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)")
        expr = self.scalar(fields["expr"], "expr") if "expr" in fields else None
        if expr is not None and not expr.strip():
            self.problem(fields["expr"], "expr is empty")
        for_s = self.duration(fields["for"], "for") if "for" in fields else 0.0
        keep_s = self.duration(fields["keep_firing_for"], "keep_firing_for") if "keep_firing_for" in fields else 0.0
        labels = self.templates(fields.get("labels"), "labels", check_names=True)
        annotations = self.templates(fields.get("annotations"), "annotations", check_names=False)
        if alert is None or not NAME.fullmatch(alert) or expr is None:
            return None
        expr_node = fields["expr"]
        assert isinstance(expr_node, ScalarNode)  # scalar() returned its text
        block = expr_node.style in ("|", ">")
        return Rule(
            alert=alert,
            expr=expr.strip(),
            # A bad part is already a problem (so the file will not load); the rest still gets checked.
            for_s=for_s or 0.0,
            keep_firing_for_s=keep_s or 0.0,
            labels=labels or {},
            annotations=annotations or {},
            group=group,
            file=self.file,
            line=node.start_mark.line + 1,
            # A block scalar's text starts on the line after its `|` or `>` indicator.
            expr_line=expr_node.start_mark.line + (2 if block else 1),
            expr_literal=expr_node.style == "|",
        )

    def templates(self, node: Node | None, what: str, *, check_names: bool) -> dict[str, Template] | None:
        if node is None:
            return {}
        if not isinstance(node, MappingNode):
            self.problem(node, f"{what} must be a mapping of names to strings")
            return None
        out: dict[str, Template] = {}
        ok = True
        for key_node, value_node in self.pairs(node):
            key = self.scalar(key_node, f"a key of {what}")
            text = self.scalar(value_node, f"{what}.{key}")
            if key is None or text is None:
                ok = False
                continue
            if check_names and (not NAME.fullmatch(key) or key.startswith("__") or key == ALERTNAME):
                self.problem(key_node, f"label name {key!r} is not allowed")
                ok = False
            try:
                out[key] = parse_template(text, value_node.start_mark.line + 1)
            except ValueError as exc:
                self.problem(value_node, f"{what}.{key}: {exc}")
                ok = False
        return out if ok else None

    def mapping(
        self, node: Node, what: str, allowed: frozenset[str], required: Sequence[str]
    ) -> dict[str, Node] | None:
        if not isinstance(node, MappingNode):
            self.problem(node, f"{what} must be a mapping")
            return None
        fields: dict[str, Node] = {}
        for key_node, value_node in self.pairs(node):
            key = self.scalar(key_node, "a key")
            if key is None:
                continue
            if key not in allowed:
                self.problem(key_node, f"unknown key {key!r} in {what} (allowed: {', '.join(sorted(allowed))})")
            else:
                fields[key] = value_node
        for key in required:
            if key not in fields:
                self.problem(node, f"{what} lacks {key!r}")
        return fields

    def pairs(self, node: MappingNode) -> list[tuple[Node, Node]]:
        """The key/value pairs of a mapping; a repeated key is a problem (YAML would keep the last silently)."""
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode):
                if key_node.value in seen:
                    self.problem(key_node, f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]})")
                seen.setdefault(key_node.value, key_node.start_mark.line + 1)
        return list(node.value)

    def sequence(self, node: Node, what: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            self.problem(node, f"{what} must be a list")
            return []
        return list(node.value)

    def scalar(self, node: Node, what: str) -> str | None:
        if not isinstance(node, ScalarNode) or node.tag == "tag:yaml.org,2002:null":
            self.problem(node, f"{what} must be a string")
            return None
        return str(node.value)

    def count(self, node: Node, what: str) -> int | None:
        text = self.scalar(node, what)
        if text is None:
            return None
        if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
            self.problem(node, f"{what} must be a whole number of 1 or more, not {text!r}")
            return None
        return int(text)

    def duration(self, node: Node, what: str) -> float | None:
        text = self.scalar(node, what)
        if text is None:
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            self.problem(node, f"{what}: {exc}")
            return None
