"""The `/` filter: `replica:NAME`, `rule:CODE-OR-NAME`, `key:PREFIX` and bare words.

Replica terms narrow every panel; rule, key and bare-word terms narrow the findings
(a bare word matches a finding's replica, rule code or name, or key prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvaudit.tui.figures import ReuseCell
from kvaudit.tui.findings import FindingRow

_PREFIXES: Final = ("replica", "rule", "key")


@dataclass(frozen=True)
class Filter:
    replicas: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    words: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Filter:
        terms: dict[str, list[str]] = {name: [] for name in (*_PREFIXES, "")}
        for token in text.split():
            name, sep, value = token.partition(":")
            if sep and name.lower() in _PREFIXES and value:
                terms[name.lower()].append(value)
            else:
                terms[""].append(token)
        return cls(tuple(terms["replica"]), tuple(terms["rule"]), tuple(terms["key"]), tuple(terms[""]))

    def __str__(self) -> str:
        terms = [f"{name}:{value}" for name in _PREFIXES for value in getattr(self, f"{name}s")]
        return " ".join([*terms, *self.words])

    def __bool__(self) -> bool:
        return bool(self.replicas or self.rules or self.keys or self.words)

    def keeps_replica(self, replica: str | None) -> bool:
        return not self.replicas or replica in self.replicas

    def keeps_cell(self, cell: ReuseCell) -> bool:
        return not self.replicas or cell.consumer in self.replicas or cell.producer in self.replicas

    def keeps_finding(self, finding: FindingRow) -> bool:
        return (
            self.keeps_replica(finding.replica)
            and (not self.rules or any(_is_rule(finding, rule) for rule in self.rules))
            and (not self.keys or any((finding.key or "").startswith(key) for key in self.keys))
            and all(_mentions(finding, word) for word in self.words)
        )


def _is_rule(finding: FindingRow, rule: str) -> bool:
    rule = rule.lower()
    return finding.code.lower().startswith(rule) or finding.rule.lower().startswith(rule)


def _mentions(finding: FindingRow, word: str) -> bool:
    return finding.replica == word or _is_rule(finding, word) or (finding.key or "").startswith(word)
