"""A deterministic fleet for the TUI tests: real emitters, real files, a fixed clock and fixed ids.

Every operation goes through `kvaudit.emit` and the OTLP JSON file exporter, as a
replica's would; only the emitter's clock and id generator are replaced, so that the
same test writes the same bytes every time (snapshot tests compare screens).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.emit import emitter as emission
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter

from .pages import KV, full_page

START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
PAGE_TOKENS = 32


class FakeClock:
    """Nanoseconds that move only when told (and by 1 µs per reading, to keep events ordered)."""

    def __init__(self, start_ns: int = START_NS) -> None:
        self.now_ns = start_ns

    def time_ns(self) -> int:
        self.now_ns += 1_000
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)


class Fleet:
    """Replicas writing `DIR/<replica>.jsonl` through the real emitter, deterministically."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.directory = directory
        self.clock = FakeClock()
        seeds = itertools.count(1)
        monkeypatch.setattr(emission, "time", SimpleNamespace(time_ns=self.clock.time_ns))
        monkeypatch.setattr(emission, "random", SimpleNamespace(Random=lambda: random.Random(next(seeds))))
        self._emitters: dict[str, Emitter] = {}

    def replica(self, name: str, kv: KVConfig = KV) -> Emitter:
        if name not in self._emitters:
            self._emitters[name] = setup_emitter(name, f"file:{self.directory}/{name}.jsonl", engine="vllm", kv=kv)
        return self._emitters[name]

    def store(
        self, replica: str, request: str, keys: list[str], *, first_page: int = 0, seconds: float = 0.002
    ) -> None:
        emitter = self.replica(replica)
        with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=request, backend="lmcache.remote") as op:
            for i, key in enumerate(keys, start=first_page):
                op.add_page(full_page(key, i))
            self.clock.advance(seconds)
            op.end(Outcome.HIT, tokens_stored=len(keys) * PAGE_TOKENS)
        emitter.flush()

    def fetch(
        self, replica: str, request: str, pages: list[PageDescriptor], *, requested_pages: int, seconds: float = 0.004
    ) -> None:
        emitter = self.replica(replica)
        used = [p for p in pages if p.used]
        outcome = Outcome.MISS if not used else Outcome.HIT if len(used) == requested_pages else Outcome.PARTIAL
        with emitter.operation(
            Op.FETCH,
            hook=Hook.VLLM_CONNECTOR,
            request_id=request,
            backend="lmcache.remote",
            tokens_requested=requested_pages * PAGE_TOKENS,
        ) as op:
            for page in pages:
                op.add_page(page)
            self.clock.advance(seconds)
            op.end(outcome, tokens_hit=len(used) * PAGE_TOKENS)
        emitter.flush()

    def conversation(self, producer: str, consumer: str, n: int, pages: int = 3) -> list[str]:
        """A first turn on `producer` stores its pages; the follow-up on `consumer` fetches them all."""
        keys = [f"{n:04x}{i:060x}" for i in range(pages)]
        self.fetch(producer, f"c{n}-t1", [], requested_pages=pages)
        self.store(producer, f"c{n}-t1", keys)
        self.clock.advance(1.0)
        fetched = [full_page(k, i, used=True) for i, k in enumerate(keys)]
        self.fetch(consumer, f"c{n}-t2", fetched, requested_pages=pages)
        self.clock.advance(1.0)
        return keys

    def close(self) -> None:
        for emitter in self._emitters.values():
            emitter.shutdown()


@pytest.fixture(name="fleet")
def fleet_fixture(trace_dir: Path, monkeypatch: pytest.MonkeyPatch):
    fleet = Fleet(trace_dir, monkeypatch)
    yield fleet
    fleet.close()
