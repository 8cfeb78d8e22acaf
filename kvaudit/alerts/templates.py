"""Annotation and label templates: the part of Prometheus' templating that rules use.

`{{ $labels.replica }}`, `{{ $value }}` and pipes into `humanize`,
`humanizePercentage` and `humanizeDuration`, e.g. `{{ $value | humanizePercentage }}`.
Anything else inside `{{ }}` is an error when the rule file is loaded, not when the
alert fires.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

_ACTION: Final = re.compile(r"\{\{-?(.*?)-?\}\}", re.DOTALL)
_LABEL: Final = re.compile(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)")


def _humanize(value: float) -> str:
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.4g}{suffix}"
    return f"{value:.4g}"


def _humanize_duration(seconds: float) -> str:
    if abs(seconds) >= 60:
        minutes, secs = divmod(round(seconds), 60)
        hours, minutes = divmod(minutes, 60)
        return " ".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)
    if abs(seconds) >= 1 or seconds == 0:
        return f"{seconds:.4g}s"
    return f"{seconds * 1000:.4g}ms"


FUNCTIONS: Final[dict[str, Callable[[float], str]]] = {
    "humanize": _humanize,
    "humanizePercentage": lambda value: f"{value * 100:.4g}%",
    "humanizeDuration": _humanize_duration,
}


@dataclass(frozen=True)
class _Action:
    label: str | None  # None: $value
    function: str | None


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text and actions, in order, and the file line it was written on."""

    parts: tuple[str | _Action, ...]
    line: int = 0

    @property
    def labels(self) -> frozenset[str]:
        """The label names the template refers to."""
        return frozenset(p.label for p in self.parts if isinstance(p, _Action) and p.label is not None)

    def render(self, labels: Mapping[str, str], value: float | None) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part.label is not None:
                out.append(labels.get(part.label, ""))
            elif value is None:
                out.append("")
            else:
                out.append(FUNCTIONS[part.function](value) if part.function else format_value(value))
        return "".join(out)


def format_value(value: float) -> str:
    """A sample value as Prometheus prints `{{ $value }}`: no trailing `.0` on whole numbers."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_template(text: str, line: int = 0) -> Template:
    """Parse a template.

    Raises:
        ValueError: an action that is not `$value` or `$labels.NAME`, optionally piped
            into one known function.
    """
    parts: list[str | _Action] = []
    position = 0
    for match in _ACTION.finditer(text):
        parts.append(text[position : match.start()])
        parts.append(_parse_action(match.group(1).strip()))
        position = match.end()
    rest = text[position:]
    if "{{" in rest:
        raise ValueError("unclosed template action '{{'")
    parts.append(rest)
    return Template(tuple(p for p in parts if p != ""), line)


def _parse_action(action: str) -> _Action:
    subject, _, function = (s.strip() for s in action.partition("|"))
    if function and function not in FUNCTIONS:
        raise ValueError(f"unknown template function {function!r} (known: {', '.join(FUNCTIONS)})")
    if subject == "$value":
        return _Action(None, function or None)
    label = _LABEL.fullmatch(subject)
    if label is None:
        raise ValueError(f"unsupported template action {{{{ {action} }}}} (use $value or $labels.NAME)")
    if function:
        raise ValueError(f"{{{{ {action} }}}}: functions apply to $value only")
    return _Action(label.group(1), None)
