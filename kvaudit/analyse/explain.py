"""Why a request missed: the pages of its prompt with their causes (docs/design.md section 7).

`queries/explain.sql` decides each page's cause from the traces (`explain_evictions`
adds each page's last eviction); this module runs it for one request and adds what SQL
does not hold: for a page the guard refused, the rule it
broke, from `kvaudit.guard` itself (the checks the hooks ran), given the fetched
descriptor and the consumer's configuration. The words a page and a request are told in
(where a copy sat, its last eviction, the rates) are here too, for `kvaudit explain` and
the TUI alike.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Final

from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Backend, Source, as_backend
from kvaudit.causes import Cause
from kvaudit.contract import KVConfig, PageDescriptor, Tier
from kvaudit.guard import violations

NS: Final = 1_000_000_000
QUERY: Final = "explain_evictions"  # explain's pages, each with its last eviction
# The fetched descriptor of a refused page, and the configuration of the process that fetched it.
_REFUSED: Final = """
SELECT p.*, r.model AS c_model, r.dtype AS c_dtype, r.layout AS c_layout, r.block_size AS c_block_size,
       r.world_size AS c_world_size, r.rank AS c_rank, r.hash_algo AS c_hash_algo, r.layers AS c_layers,
       r.kv_heads AS c_kv_heads, r.head_size AS c_head_size, r.geometry AS c_geometry
FROM pages p LEFT JOIN replicas r ON r.resource_id = p.resource_id
WHERE p.op = 'fetch' AND p.used = false AND p.request_id = getvariable('kvaudit_request_id')
  AND p.replica = getvariable('kvaudit_replica') AND p.token_start = getvariable('kvaudit_token_start')
"""
# What rule KVA007 counts as lost, per process of the replicas involved (the counts are cumulative
# per process: the largest is the total).
_LOSS: Final = """
SELECT replica, resource_id,
       coalesce(max(telemetry_dropped_spans), 0) + coalesce(max(telemetry_failed_exports), 0)
           + coalesce(max(telemetry_errors), 0) + coalesce(max(telemetry_lost_batches), 0) AS lost,
       coalesce(sum(dropped_events), 0) AS dropped_events
FROM spans
WHERE telemetry_dropped_spans > 0 OR telemetry_failed_exports > 0 OR telemetry_errors > 0
   OR telemetry_lost_batches > 0 OR dropped_events > 0
GROUP BY replica, resource_id
ORDER BY replica, resource_id
"""


@dataclass(frozen=True)
class ExplainedPage:
    """One page of a prompt: a row of `queries/explain_evictions.sql` (its header and explain.sql's say what
    each column holds), and `rule`."""

    request_id: str
    replica: str
    lookup_ns: int
    prompt_tokens: int | None
    page: int
    token_start: int
    token_end: int
    key: str
    kv_group: int  # the KV cache group (0 where the traces name none): a hybrid model's has a page each
    kv_group_kind: str | None
    cause: Cause
    achievable: bool
    counted: bool  # stands for its tokens in sums: one page per token range (docs/design.md section 7.1)
    tier: str | None
    holder: str | None
    producer: str | None
    stored_ns: int | None
    evicted_ns: int | None
    evicted_backend: str | None
    evicted_tier: str | None
    evicted_replica: str | None
    evict_reason: str | None
    evicted_by: str | None
    rule: str | None = None  # rejected: why the guard refused it (`KVA005 layout, ...`)

    @property
    def tokens(self) -> int:
        return self.token_end - self.token_start

    @property
    def where(self) -> str:
        """The store of the copy its cause is about: `remote`, or `cpu of r2`."""
        return _where(self.tier, self.holder)

    def eviction(self) -> str:
        """Its last eviction up to the lookup, in words, with its time from the lookup ("" without one)."""
        if self.evicted_ns is None:
            return ""
        # A shared store's eviction is made by whichever replica's store needed the room.
        shared = self.evicted_tier == Tier.REMOTE.value
        where = self.evicted_tier if shared else _where(self.evicted_tier, self.evicted_replica)
        when = self.since_lookup(self.evicted_ns)
        text = f"{self.evict_reason or 'evicted'} from {where} ({self.evicted_backend}) {when}"
        if self.evicted_by:
            text += (
                f", for {self.evicted_replica}'s request {self.evicted_by}"
                if shared
                else f", for request {self.evicted_by}"
            )
        elif shared and self.evicted_replica:
            text += f", by {self.evicted_replica}"
        return text

    def since_lookup(self, time_ns: int | None) -> str:
        """A time as seconds from the request's lookup: negative before it ("" for None)."""
        return "" if time_ns is None else f"{(time_ns - self.lookup_ns) / NS:+.3f} s"


@dataclass(frozen=True)
class Explanation:
    """One request on one replica, page by page."""

    request_id: str
    replica: str
    lookup_ns: int
    prompt_tokens: int | None
    pages: list[ExplainedPage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the traces lack that the answer depends on

    @property
    def hit_tokens(self) -> int:
        return sum(page.tokens for page in self.pages if page.counted and page.cause.hit)

    @property
    def achievable_tokens(self) -> int:
        return sum(page.tokens for page in self.pages if page.counted and page.achievable)

    def tokens_by_cause(self) -> Counter[Cause]:
        tokens: Counter[Cause] = Counter()
        for page in self.pages:
            if page.counted:
                tokens[page.cause] += page.tokens
        return tokens

    @property
    def looked_up_at(self) -> str:
        """The lookup's time, ISO 8601 in UTC to the millisecond."""
        return dt.datetime.fromtimestamp(self.lookup_ns / NS, dt.UTC).isoformat(timespec="milliseconds")

    def rates(self) -> str:
        """The hit rate beside the achievable one, in words."""
        prompt = self.prompt_tokens or sum(page.tokens for page in self.pages if page.counted)
        hit, achievable = self.hit_tokens, self.achievable_tokens
        text = (
            f"hit {hit:,} of {prompt:,} prompt tokens ({_share(hit, prompt)}); achievable {achievable:,}"
            f" ({_share(achievable, prompt)}): {_share(achievable - hit, prompt)} left on the table"
        )
        # What the fleet had held but lost before the lookup: no copy was left to achieve, yet
        # a request that lost everything to eviction did not miss "nothing".
        by_cause = self.tokens_by_cause()
        lost = [
            f"{what} {by_cause[cause]:,} ({_share(by_cause[cause], prompt)})"
            for cause, what in ((Cause.EVICTED, "to eviction"), (Cause.STORED_AFTER_LOOKUP, "to the store race"))
            if by_cause[cause]
        ]
        return text + (f"; lost {' and '.join(lost)}" if lost else "")

    def runs(self) -> list[list[ExplainedPage]]:
        """The pages in runs of consecutive pages with the same cause, copy and rule: what the
        table shows as one row each."""
        runs: list[list[ExplainedPage]] = []
        for page in self.pages:
            last = runs[-1][-1] if runs else None
            if last is not None and (last.kv_group, last.cause, last.where, last.producer, last.rule) == (
                page.kv_group,
                page.cause,
                page.where,
                page.producer,
                page.rule,
            ):
                runs[-1].append(page)
            else:
                runs.append([page])
        return runs


def _where(tier: str | None, holder: str | None) -> str:
    if tier is None:
        return ""
    return tier if holder is None else f"{tier} of {holder}"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


_COLUMNS: Final = tuple(f.name for f in fields(ExplainedPage) if f.name != "rule")


def explain(
    source: Source, request_id: str, *, replica: str | None = None, trace_id: str | None = None
) -> list[Explanation]:
    """The requests of id `request_id` on each replica that served it (or on `replica`), in replica
    order, then in the order of their lookups: a lookup of an id after its fetches or stores on
    that replica starts another request (docs/design.md section 7.1).

    Args:
        trace_id: only a request with a span in this trace.
    """
    backend = as_backend(source)
    variables = {"kvaudit_request_id": request_id, "kvaudit_replica": replica, "kvaudit_trace_id": trace_id}
    columns, rows = run_named(backend, QUERY, variables)
    explanations: dict[tuple[str, int], Explanation] = {}
    for row in rows:
        values = dict(zip(columns, row))
        page = ExplainedPage(**{name: values[name] for name in _COLUMNS} | {"cause": Cause(values["cause"])})
        if page.cause == Cause.REJECTED:
            page = _with_rule(backend, page)
        request = explanations.setdefault(
            (page.replica, page.lookup_ns),
            Explanation(page.request_id, page.replica, page.lookup_ns, page.prompt_tokens),
        )
        request.pages.append(page)
    ordered = [explanations[key] for key in sorted(explanations)]
    requests_on = Counter(request.replica for request in ordered)
    for request in ordered:
        if requests_on[request.replica] > 1:
            # An id reused on one replica (vLLM's offline ids restart with every process).
            request.notes.append(
                f"request id {request_id} names {requests_on[request.replica]} requests on {request.replica}:"
                " each is explained, in the order of their lookups (--trace-id picks one)"
            )
        request.notes.extend(_notes(backend, request))
    return ordered


def _notes(backend: Backend, request: Explanation) -> list[str]:
    """Where the traces are incomplete for this request: evictions of stores they lack, replicas
    that record a share of their requests, and telemetry loss (rule KVA007), among the replicas
    involved (its own, its pages' producers, the evicting ones)."""
    notes: list[str] = []
    unstored = [page.page for page in request.pages if page.cause == Cause.EVICTED and page.producer is None]
    if unstored:
        notes.append(
            f"{len(unstored)} evicted page(s) have no store in these traces (the eviction proves one):"
            " the store was not recorded (a sampled replica) or its span was lost"
        )
    involved = {request.replica} | {
        name for page in request.pages for name in (page.producer, page.evicted_replica) if name
    }
    _, rates = backend.query(
        "SELECT replica, min(sample_rate) FROM replicas WHERE sample_rate IS NOT NULL GROUP BY replica ORDER BY replica"
    )
    for replica, rate in rates:
        if replica in involved:
            notes.append(
                f"{replica} records a share of its requests (sample rate {rate:g}, docs/design.md section 3.10):"
                " a store by a request it did not record is not in these traces"
            )
    _, rows = backend.query(_LOSS)
    for replica, _, lost, dropped_events in rows:
        if replica not in involved:
            continue
        notes.append(
            f"telemetry loss (KVA007) on {replica}: {lost} spans, exports or batches lost,"
            f" {dropped_events} page descriptors dropped: causes there may miss a store or an eviction"
        )
    return notes


def _with_rule(backend: Backend, page: ExplainedPage) -> ExplainedPage:
    """The page with the guard's reasons for refusing it, judged as the consuming process judged it."""
    variables = {
        "kvaudit_request_id": page.request_id,
        "kvaudit_replica": page.replica,
        "kvaudit_token_start": page.token_start,
    }
    columns, rows = backend.query(_REFUSED, variables)
    reasons: list[str] = []
    for row in rows:
        values = dict(zip(columns, row))
        # The pages view's descriptor columns are named as the descriptor's fields (docs/design.md section 3.9).
        present = {name: values[name] for name in PageDescriptor.__struct_fields__ if values.get(name) is not None}
        if "shape" in present:
            present["shape"] = tuple(present["shape"])
        fetched = PageDescriptor(**present)
        consumer = KVConfig(**{name: values[f"c_{name}"] for name in KVConfig.__struct_fields__})
        reasons += violations(fetched, PageDescriptor.from_config(consumer))
    return dataclasses.replace(page, rule=", ".join(dict.fromkeys(reasons)) or None)
