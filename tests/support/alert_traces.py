"""Hand-built traffic for the alerting tests: clean reuse and the faults the default pack must catch.

Every trace goes through the real emitter and file exporter. r1 computes prefixes and
stores their pages; r2 serves the follow-up turns and fetches them. Emission runs on a
test clock, so an operation takes exactly as long as the traffic says, however
loaded the machine running the tests is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from kvaudit.contract import EvictReason, Hook, Op, Outcome, PageDescriptor, SpanAttr, Tier
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter

from .fleet import page
from .pages import KV

PAGES = 24  # above the 20-page minimum of the efficiency rules
_NOW_NS = [1_700_000_000 * 10**9]


def _advance(seconds: float) -> None:
    _NOW_NS[0] += int(seconds * 1e9)


def _tick() -> int:
    """The test clock moves 1 µs per reading, so events keep their order."""
    _advance(1e-6)
    return _NOW_NS[0]


def _on_test_clock(build: Callable[[Path], None]) -> Callable[[Path], None]:
    @functools.wraps(build)
    def on_test_clock(trace_dir: Path) -> None:
        # Only emission reads this clock; the exporter thread keeps the real one.
        with mock.patch("kvaudit.emit.emitter.time", SimpleNamespace(time_ns=_tick)):
            build(trace_dir)

    return on_test_clock


class Clock:
    """A controllable clock for the rule engine (Unix seconds)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def emitter(trace_dir: Path, replica: str) -> Emitter:
    return setup_emitter(replica, f"file:{trace_dir}/{replica}.jsonl", engine="vllm", kv=KV, export_delay_s=0.01)


def store(r: Emitter, keys: range, request: str = "q") -> None:
    with r.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=request) as op:
        for i in keys:
            op.add_page(page(f"{i:064x}", i))
        op.end(Outcome.HIT, tokens_stored=32 * len(keys))


def fetch(r: Emitter, pages: list[PageDescriptor], outcome: Outcome = Outcome.HIT, *, slow_s: float = 0) -> None:
    hit = sum(32 for p in pages if p.used)
    with r.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="q", tokens_requested=32 * len(pages)) as op:
        for p in pages:
            op.add_page(p)
        _advance(slow_s)
        op.end(outcome, tokens_hit=hit)


@_on_test_clock
def clean(trace_dir: Path) -> None:
    """r2 fetches and uses every page r1 stored: what a healthy pool looks like."""
    r1, r2 = emitter(trace_dir, "r1"), emitter(trace_dir, "r2")
    store(r1, range(PAGES))
    for i in range(PAGES):
        fetch(r2, [page(f"{i:064x}", i, used=True)])
    r1.shutdown()
    r2.shutdown()


@_on_test_clock
def used_malformed_page(trace_dir: Path) -> None:
    """On top of clean traffic, r2 uses a bare raw-pointer page with no metadata (KVA001, critical)."""
    clean(trace_dir)
    r2 = emitter(trace_dir, "r2")
    fetch(r2, [PageDescriptor(key="ff" * 32, used=True, transfer="raw_ptr", address=0x7F00DEAD0000)])
    r2.shutdown()


@_on_test_clock
def rejected_pages(trace_dir: Path) -> None:
    """r2 turns down pages r1 stored (a safe miss each)."""
    r1, r2 = emitter(trace_dir, "r1"), emitter(trace_dir, "r2")
    store(r1, range(3))
    fetch(r2, [page(f"{i:064x}", i, used=False) for i in range(3)], Outcome.REJECTED)
    r1.shutdown()
    r2.shutdown()


@_on_test_clock
def telemetry_loss(trace_dir: Path) -> None:
    """Clean traffic, plus a trace file with a line that is not JSON and one cut short."""
    clean(trace_dir)
    (trace_dir / "r3.jsonl").write_bytes(b'not json\n{"resourceSpans": [')


@_on_test_clock
def recomputed_prefixes(trace_dir: Path) -> None:
    """r2 gets r1's prefixes but recomputes and stores them again: cross-replica reuse fails."""
    r1, r2 = emitter(trace_dir, "r1"), emitter(trace_dir, "r2")
    store(r1, range(PAGES))
    r1.shutdown()
    store(r2, range(PAGES), request="q2")
    r2.shutdown()


@_on_test_clock
def slow_fetches(trace_dir: Path) -> None:
    """Every fetch of one 32-token page takes 5 ms, far more than its 3.2 ms recompute estimate."""
    r1, r2 = emitter(trace_dir, "r1"), emitter(trace_dir, "r2")
    store(r1, range(PAGES))
    for i in range(PAGES):
        fetch(r2, [page(f"{i:064x}", i, used=True)], slow_s=0.005)
    r1.shutdown()
    r2.shutdown()


@_on_test_clock
def evicted_then_needed(trace_dir: Path) -> None:
    """r1's pool evicts its pages to make room, and then computes and stores them all again."""
    r1 = emitter(trace_dir, "r1")
    store(r1, range(PAGES))
    reason = {SpanAttr.EVICT_REASON: EvictReason.CAPACITY.value}
    with r1.operation(Op.EVICT, hook=Hook.LMCACHE_BACKEND, attributes=reason) as op:
        for i in range(PAGES):
            op.add_page(PageDescriptor(key=f"{i:064x}", bytes=16384, tier=Tier.CPU.value))
        op.end()
    store(r1, range(PAGES), request="q2")
    r1.shutdown()
