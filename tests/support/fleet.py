"""Hand-built fleets for tests with known answers: replicas emitting through the real exporter.

Time is set by the test (`Fleet.at`), so store/fetch ordering and clock skew are exact.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import exporter_for, replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.read.store import TraceStore

from .pages import KV, full_page


def page(key: str, index: int = 0, **changes: object) -> PageDescriptor:
    """A complete, portable page (no process-local address), with `changes` applied."""
    return msgspec.structs.replace(full_page(key, index), **{"address": None, **changes})


class Fleet:
    """Emitters of several replicas writing into one trace directory, on a test clock."""

    def __init__(self, trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trace_dir = trace_dir
        self.now_ns = 1_700_000_000 * 10**9
        # Only emission reads this clock; the exporter thread keeps the real one.
        monkeypatch.setattr("kvaudit.emit.emitter.time", SimpleNamespace(time_ns=lambda: self.now_ns))
        self.emitters: list[Emitter] = []

    def at(self, seconds: float) -> Fleet:
        self.now_ns = 1_700_000_000 * 10**9 + int(seconds * 1e9)
        return self

    def replica(
        self, name: str, kv: KVConfig = KV, *, engine: str = "vllm", max_pages_per_span: int = 65536
    ) -> Emitter:
        """A process of replica `name`; another `engine` makes another process of the same replica."""
        path = self.trace_dir / f"{name}-{engine}.jsonl"
        emitter = Emitter(
            replica_resource(name, engine=engine, kv=kv),
            SpanBatcher(exporter_for(f"file:{path}", name)),
            max_pages_per_span=max_pages_per_span,
        )
        self.emitters.append(emitter)
        return emitter

    def store(self, emitter: Emitter, pages: list[PageDescriptor], request: str = "q", **span: object) -> None:
        with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=request, **span) as op:
            for p in pages:
                op.add_page(p)
            op.end(Outcome.HIT, tokens_stored=sum((p.token_end or 0) - (p.token_start or 0) for p in pages))

    def fetch(
        self,
        emitter: Emitter,
        pages: list[PageDescriptor],
        request: str = "q",
        *,
        tokens_requested: int | None = None,
        outcome: Outcome = Outcome.HIT,
        hook: Hook = Hook.VLLM_CONNECTOR,
        op: Op = Op.FETCH,
        backend: str | None = None,
        duration_s: float = 0.0,
    ) -> None:
        hit = sum((p.token_end or 0) - (p.token_start or 0) for p in pages if p.used is not False)
        with emitter.operation(
            op, hook=hook, request_id=request, tokens_requested=tokens_requested or hit, backend=backend
        ) as operation:
            for p in pages:
                operation.add_page(p)
            self.now_ns += int(duration_s * 1e9)
            operation.end(outcome, tokens_hit=hit)

    def open(self) -> TraceStore:
        for emitter in self.emitters:
            emitter.shutdown()
        self.emitters.clear()
        store = TraceStore([self.trace_dir], workers=1)
        store.refresh()
        return store
