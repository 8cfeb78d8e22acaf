"""Writing `kvaudit explain`: a request's pages with their causes, as a table or as JSON lines.

The table shows one row per run of consecutive pages with the same cause and copy (a
range of tokens), then the request's tokens by cause, what those misses cost to recompute
and the remedy of each cause, and the hit rate beside the achievable one. Every value from a
trace (replicas, keys, backends, request ids) goes into a cell as `Text` (`cell`), never
into markup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final, TextIO

from rich.table import Table
from rich.text import Text

from kvaudit.analyse.explain import ExplainedPage, Explanation
from kvaudit.causes import REMEDIES, Cause
from kvaudit.present.rows import json_line
from kvaudit.present.terminal import cell, console, print_wide

KEY_WIDTH: Final = 12
_STYLE: Final = {
    Cause.HIT_GPU: "green",
    Cause.HIT_LOCAL: "green",
    Cause.HIT_POOL: "green",
    Cause.REJECTED: "red",
    Cause.OUTSIDE_WINDOW: "dim",
}


def write_json(explanation: Explanation, recompute_s: Sequence[float | None], stream: TextIO) -> None:
    """One object per page: the columns of `queries/explain.sql`, the guard's rule, and its recompute time."""
    for page, seconds in zip(explanation.pages, recompute_s, strict=True):
        stream.write(json_line({**dataclasses.asdict(page), "cause": page.cause.value, "recompute_s": seconds}))


def write_table(explanation: Explanation, recompute_s: Sequence[float | None], cost_note: str, stream: TextIO) -> None:
    """The pages, then the tokens and recompute time by cause, then the hit rate beside the achievable one."""
    out = console(stream)
    title = Text.assemble(
        "request ",
        cell(explanation.request_id),
        " on ",
        cell(explanation.replica),
        f", looked up at {explanation.looked_up_at}",
    )
    pages = Table(title=title, header_style="bold", show_edge=False, title_justify="left")
    for name in ("pages", "tokens", "key", "cause", "where", "producer", "stored", "last eviction", "detail"):
        pages.add_column(name, overflow="fold", no_wrap=name == "key")
    # Consecutive pages with the same cause and copy are one row, a range of tokens (the
    # stored time and the eviction are its first page's); JSON keeps one record per page.
    for run in explanation.runs():
        first, last = run[0], run[-1]
        pages.add_row(
            cell(str(first.page) if len(run) == 1 else f"{first.page}-{last.page}"),
            cell(f"{first.token_start}-{last.token_end}"),
            cell(_short(first.key) if len(run) == 1 else f"{_short(first.key)} +{len(run) - 1}"),
            Text(first.cause.value + _group(first), style=_STYLE.get(first.cause, "yellow")),
            cell(first.where),
            cell(first.producer),
            cell(first.since_lookup(first.stored_ns)),
            cell(first.eviction()),
            cell(first.rule or ""),
        )
    print_wide(out, pages)
    by_cause = Table(header_style="bold", show_edge=False)
    for name in ("cause", "pages", "tokens", "recompute ms", "remedy"):
        by_cause.add_column(name, justify="right" if name in ("pages", "tokens", "recompute ms") else "left")
    for cause in Cause:
        chosen = [(p, s) for p, s in zip(explanation.pages, recompute_s, strict=True) if p.cause == cause]
        if not chosen:
            continue
        known = [s for _, s in chosen if s is not None]
        by_cause.add_row(
            Text(cause.value, style=_STYLE.get(cause, "yellow")),
            cell(len(chosen)),
            cell(sum(p.tokens for p, _ in chosen)),
            cell("" if cause.hit or len(known) < len(chosen) else f"{1e3 * sum(known):,.1f}"),
            cell(REMEDIES.get(cause, "")),
        )
    out.print()
    print_wide(out, by_cause)
    print_wide(out, Text(explanation.rates()))
    for note in explanation.notes:
        print_wide(out, cell(f"note: {note}"))
    print_wide(out, cell(cost_note))


def _short(key: str) -> str:
    return key if len(key) <= KEY_WIDTH + 4 else f"{key[:KEY_WIDTH]}…"


def _group(page: ExplainedPage) -> str:
    """A hybrid model's page names its KV cache group: ` (group 1, sliding_window)`."""
    return f" (group {page.kv_group}, {page.kv_group_kind})" if page.kv_group_kind else ""
