"""The fleet every backend must answer alike about, and answers in a form both backends share.

`write_fleet` writes the traces through the real emitter; `answers` puts a backend's rows
in an order and form DuckDB and ClickHouse share, so the two compare equal.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import msgspec

from kvaudit.backends import Backend
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter

from .pages import KV, full_page

# Columns whose values the Collector's table does not keep (see clickhouse_views).
NOT_IN_CLICKHOUSE = {"file", "line", "dropped_attributes", "dropped_events", "attributes"}


def write_fleet(directory: Path) -> None:
    """Two replicas sharing a pool, with the cases the views, queries and audit rules must agree
    on: complete and incomplete pages, rejected ones, process-local addresses, a wrong size,
    another layout than the consumer's, keys nobody stored, a page without a key on either
    side (which must not meet: a key id of NULL is an id on ClickHouse); and a third replica's GPU cache
    (vLLM's KV events) taking in blocks from the pool, its own cache and computation."""
    producer = setup_emitter("r1", f"file:{directory}/r1.jsonl", engine="vllm", kv=KV, export_delay_s=0.01)
    consumer = setup_emitter("r2", f"file:{directory}/r2.jsonl", engine="lmcache", kv=KV, export_delay_s=0.01)
    for n in range(4):
        with producer.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=f"a{n}", backend="lmcache.remote") as op:
            for i in range(3):
                op.add_page(full_page(f"{n:060x}{i:04x}", i))
            if n == 0:
                op.add_page(PageDescriptor(token_start=96, token_end=128))
            op.end(Outcome.HIT, tokens_stored=96)
    for n in range(5):  # request a4 fetches keys nobody stored
        with consumer.operation(
            Op.FETCH, hook=Hook.LMCACHE_ENGINE, request_id=f"b{n}", tokens_requested=128, backend="lmcache.remote"
        ) as op:
            op.add_page(full_page(f"{n:060x}{0:04x}", 0, used=n != 1))
            op.add_page(PageDescriptor(key=f"{n:060x}{1:04x}", token_start=32, transfer="raw_ptr", used=True))
            # The third page as stored, but wrong in size (n = 2) or laid out otherwise (n = 3).
            third = full_page(f"{n:060x}{2:04x}", 2, used=True)
            if n == 2:
                third = msgspec.structs.replace(third, bytes=1000)
            if n == 3:
                third = msgspec.structs.replace(third, layout="NB_2_BS_NH_HS", address=None)
            op.add_page(third)
            if n == 4:
                op.add_page(PageDescriptor(token_start=96, token_end=128, used=False))
            op.end(Outcome.PARTIAL, tokens_hit=64)
        with consumer.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR, request_id=f"b{n}", tokens_requested=128) as op:
            op.end(Outcome.MISS if n == 4 else Outcome.HIT, tokens_hit=0 if n == 4 else 96)
    with consumer.operation(Op.EVICT, hook=Hook.LMCACHE_BACKEND, request_id="b0") as op:
        op.end(Outcome.HIT)
    events = setup_emitter("r3", f"file:{directory}/r3.jsonl", engine="vllm", kv=KV, export_delay_s=0.01)
    _gpu_cache(events, time.time_ns())
    for emitter in (producer, consumer, events):
        emitter.shutdown()


def _gpu_cache(emitter: Emitter, start_ns: int) -> None:
    """Blocks entering a GPU cache: from the pool (one fetch equally near before and after), held
    already, computed after an eviction, and fetched too late to count."""

    def operation(op: Op, at_s: float, keys: list[str], tier: str = "gpu") -> None:
        gpu = tier == "gpu"
        with emitter.operation(
            op,
            hook=Hook.VLLM_KV_EVENTS if gpu else Hook.LMCACHE_ENGINE,
            backend="vllm.prefix_cache" if gpu else f"lmcache.{tier}",
            at_ns=start_ns + int(at_s * 1e9),
        ) as operation:
            for index, key in enumerate(keys):
                used = None if gpu else True
                operation.add_page(
                    PageDescriptor(key=key, token_start=16 * index, token_end=16 * index + 16, tier=tier, used=used)
                )

    operation(Op.FETCH, 0, ["e1"], "cpu")
    operation(Op.STORE, 0.5, ["e1", "e2"])  # e1 from the pool, e2 computed
    operation(Op.EVICT, 1, ["e2"])
    operation(Op.STORE, 2, ["e1", "e2"])  # e1 held, e2 computed again
    operation(Op.FETCH, 3.5, ["e2"], "cpu")  # beyond the skew
    operation(Op.FETCH, 5, ["e3"], "cpu")
    operation(Op.FETCH, 6, ["e3"], "remote")
    operation(Op.STORE, 5.5, ["e3"])  # as near the cpu fetch as the remote one: the earlier wins


def answers(backend: Backend, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[Any]]:
    """Columns and rows in an order and form both backends share."""
    columns, rows = backend.query(sql, params)
    keep = [i for i, name in enumerate(columns) if name not in NOT_IN_CLICKHOUSE]
    normal = [tuple(_normal(row[i]) for i in keep) for row in rows]
    return [columns[i] for i in keep], sorted(normal, key=repr)


class _Float(float):
    """A float that equals another within the engines' rounding (sums in another order differ in
    the last digits), and sorts by its first digits."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and math.isclose(self, other, rel_tol=1e-9, abs_tol=1e-12)

    __hash__ = float.__hash__

    def __repr__(self) -> str:
        return f"{float(self):.6g}"


def _normal(value: Any) -> Any:
    if isinstance(value, float | decimal.Decimal):
        return _Float(value)
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, list):
        return tuple(value)
    return value


def named_queries() -> list[str]:
    """Every top-level named query: those in subfolders need the set-up of their own module
    (the audit rules are compared through the auditor), and `views.sql` defines the views
    for the `duckdb` shell rather than querying them."""
    names = (entry.name for entry in files("kvaudit.queries").iterdir() if entry.name.endswith(".sql"))
    return sorted(name.removesuffix(".sql") for name in names if name != "views.sql")
