"""Writing `kvaudit explain`: a request's pages with their causes, as a table or as JSON lines.

The table shows one row per page and then the request's tokens by cause, what those
misses cost to recompute, and the hit rate beside the achievable one. Every value from a
trace (replicas, keys, backends, request ids) goes into a cell as `Text` (`cell`), never
into markup.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Final, TextIO

from rich.table import Table
from rich.text import Text

from kvaudit.analyse.explain import ExplainedPage, Explanation
from kvaudit.causes import Cause
from kvaudit.contract import Tier
from kvaudit.present.rows import json_line
from kvaudit.present.terminal import cell, console, print_wide

KEY_WIDTH: Final = 12
NS: Final = 1_000_000_000
_STYLE: Final = {Cause.HIT_GPU: "green", Cause.HIT_LOCAL: "green", Cause.HIT_POOL: "green", Cause.REJECTED: "red"}


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
        f", looked up at {_time(explanation.lookup_ns)}",
    )
    pages = Table(title=title, header_style="bold", show_edge=False, title_justify="left")
    for name in ("page", "tokens", "key", "cause", "where", "producer", "stored", "last eviction", "detail"):
        pages.add_column(name, overflow="fold", no_wrap=name == "key")
    for page in explanation.pages:
        pages.add_row(
            cell(page.page),
            cell(f"{page.token_start}-{page.token_end}"),
            cell(_short(page.key)),
            Text(page.cause.value, style=_STYLE.get(page.cause, "yellow")),
            cell(_where(page.tier, page.holder)),
            cell(page.producer),
            cell(_relative(page.stored_ns, explanation.lookup_ns)),
            cell(_eviction(page, explanation.lookup_ns)),
            cell(page.rule or ""),
        )
    print_wide(out, pages)
    by_cause = Table(header_style="bold", show_edge=False)
    for name in ("cause", "pages", "tokens", "recompute ms"):
        by_cause.add_column(name, justify="left" if name == "cause" else "right")
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
        )
    out.print()
    print_wide(out, by_cause)
    print_wide(out, Text(_rates(explanation)))
    print_wide(out, cell(cost_note))


def _rates(explanation: Explanation) -> str:
    prompt = explanation.prompt_tokens or sum(page.tokens for page in explanation.pages)
    hit, achievable = explanation.hit_tokens, explanation.achievable_tokens
    return (
        f"hit {hit:,} of {prompt:,} prompt tokens ({_share(hit, prompt)}); achievable {achievable:,}"
        f" ({_share(achievable, prompt)}): {_share(achievable - hit, prompt)} left on the table"
    )


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _where(tier: str | None, holder: str | None) -> str:
    if tier is None:
        return ""
    return tier if holder is None else f"{tier} of {holder}"


def _eviction(page: ExplainedPage, lookup_ns: int) -> str:
    if page.evicted_ns is None:
        return ""
    # A shared store's eviction is made by whichever replica's store needed the room.
    shared = page.evicted_tier == Tier.REMOTE.value
    where = page.evicted_tier if shared else _where(page.evicted_tier, page.evicted_replica)
    when = _relative(page.evicted_ns, lookup_ns)
    text = f"{page.evict_reason or 'evicted'} from {where} ({page.evicted_backend}) {when}"
    if page.evicted_by:
        text += (
            f", for {page.evicted_replica}'s request {page.evicted_by}"
            if shared
            else f", for request {page.evicted_by}"
        )
    elif shared and page.evicted_replica:
        text += f", by {page.evicted_replica}"
    return text


def _relative(time_ns: int | None, lookup_ns: int) -> str:
    """A time as seconds from the lookup: negative before it."""
    return "" if time_ns is None else f"{(time_ns - lookup_ns) / NS:+.3f} s"


def _time(time_ns: int) -> str:
    return dt.datetime.fromtimestamp(time_ns / NS, dt.UTC).isoformat(timespec="milliseconds")


def _short(key: str) -> str:
    return key if len(key) <= KEY_WIDTH + 4 else f"{key[:KEY_WIDTH]}…"
