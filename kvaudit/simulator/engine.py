"""The event loop: sessions arrive, requests are routed, served against the pool, and traced.

Each replica serves its queue one prefill at a time (decode is not modelled beyond
spacing a session's turns). A request's lookup and fetch happen when it starts, its
store when its prefill ends (or later, with the `late-store` fault), so a page is
never fetched before it was stored, in the pool as in the trace. Every operation goes
through the real emitter, stamped in simulated time. At each lookup the fate of every
page of the prompt is recorded as ground truth (`page_truth`, docs/design.md section 7).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from kvaudit.contract import (
    GEOMETRY_TAG,
    EvictReason,
    Hook,
    KVConfig,
    Op,
    Outcome,
    PageDescriptor,
    SpanAttr,
    Tier,
)
from kvaudit.emit.emitter import Emitter, Operation
from kvaudit.emit.setup import replica_resource, setup_emitter
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.simulator.faults import Faults, GroundTruth, Injector
from kvaudit.simulator.model import LAYOUT_PACKED, LAYOUT_SPLIT, PRESETS, CostModel, ModelGeometry
from kvaudit.simulator.page_truth import Fetched, PageTruth, PageTruthRecorder
from kvaudit.simulator.pool import Entry, LRUTier
from kvaudit.simulator.records import write_records
from kvaudit.simulator.router import make_router
from kvaudit.simulator.workload import Session, new_session, next_prompt

GIB: Final = 1 << 30
NS: Final = 1_000_000_000
# Simulated time starts at a fixed instant, so that a seed fixes every timestamp.
EPOCH_NS: Final = 1_767_225_600 * NS  # 2026-01-01T00:00:00Z
GROUND_TRUTH_FILE: Final = "ground_truth.jsonl"
PAGE_TRUTH_FILE: Final = "page_truth.jsonl"
TRACES_DIR: Final = "traces"  # beside the ground truth, so that a reader of the traces never sees it
POOL_BACKEND: Final = "sim.pool"
LOCAL_BACKEND: Final = "sim.local"
TIER_POOL: Final = Tier.REMOTE.value
TIER_LOCAL: Final = Tier.CPU.value
# Without sharing each replica's pool is its own store, a tier apart from its local one
# (docs/design.md section 7.1: only `remote` is shared by the fleet).
TIER_PRIVATE_POOL: Final = Tier.DISK.value
ENGINE: Final = "vllm"
VERSION_BEFORE: Final = "0.25.0"
VERSION_UPGRADED: Final = "0.26.0"  # the release that packed the KV layout (vLLM PR #44455)
# Flush an emitter every so many spans: the simulator outruns the exporter thread,
# and a full queue would drop spans (which the audit would rightly call telemetry loss).
FLUSH_EVERY: Final = 2048


@dataclass(frozen=True)
class SimConfig:
    replicas: int = 2
    model: ModelGeometry = PRESETS["gemma-2-27b"]
    page_tokens: int = 256
    pool_bytes: int = 256 * GIB
    # False: no sharing, each replica has a private pool of pool_bytes / replicas (the baseline).
    shared: bool = True
    local_bytes: int = 0
    router: str = "round-robin"
    mix: dict[str, float] = field(default_factory=lambda: {"chat": 0.4, "agent": 0.2, "shared": 0.2, "oneshot": 0.2})
    rate: float = 0.25
    duration_s: float = 300.0
    seed: int = 0
    cost: CostModel = field(default_factory=CostModel)
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.page_tokens < 1 or self.rate <= 0 or self.duration_s <= 0:
            raise ValueError("replicas, page tokens, rate and duration must be positive")
        if self.pool_bytes < 0 or self.local_bytes < 0:
            raise ValueError("pool and local tier sizes must not be negative")


@dataclass
class RequestRecord:
    """What happened to one request, and what it would have cost without any reuse."""

    request_id: str
    session: str
    workload: str
    replica: str
    keys: list[str]
    tokens: int
    arrival_ns: int
    start_ns: int = 0
    finish_ns: int = 0
    lookup_hit_tokens: int = 0
    used_tokens: int = 0
    # The leading pages of which a compatible copy existed anywhere in the fleet at the lookup, or that were used.
    achievable_tokens: int = 0
    cross_tokens: int = 0
    rejected_tokens: int = 0  # found but not used: refused by the guard, or after a refused page
    fetched_bytes: int = 0
    transfer_s: float = 0.0
    prefill_s: float = 0.0
    prefill_no_reuse_s: float = 0.0
    ttft_s: float = 0.0
    ttft_no_reuse_s: float = 0.0


@dataclass
class SimResult:
    config: SimConfig
    requests: list[RequestRecord]
    ground_truth: list[GroundTruth]
    files: list[Path]
    pages: list[PageTruth] = field(default_factory=list)


@dataclass
class _Request:
    record: RequestRecord
    session: Session
    output_tokens: int
    think_s: float
    parent: SpanContext
    computed: list[int] = field(default_factory=list)  # page indices prefilled (not loaded and used)


class _Discard(SpanExporter):
    """Where spans go when a run only wants its statistics (parameter sweeps)."""

    def export(self, spans: Sequence[object]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class _Replica:
    def __init__(self, index: int, name: str, local_bytes: int) -> None:
        self.index = index
        self.name = name
        self.local = LRUTier(local_bytes) if local_bytes else None
        self.queue: deque[_Request] = deque()
        self.running: _Request | None = None
        self.upgraded = False
        self.spans = 0
        self.kv: KVConfig
        self.emitter: Emitter
        # What prevention adds to each key this replica makes (empty without it).
        self.key_suffix = ""

    def pool_key(self, key: str) -> str:
        return key + self.key_suffix


class Simulation:
    """One run into `out`: `traces/<replica>.jsonl`, `ground_truth.jsonl`, `page_truth.jsonl`; None: into nowhere."""

    def __init__(self, config: SimConfig, out: Path | None = None) -> None:
        self.config = config
        self.out = out
        self.replicas = config.replicas
        pools = 1 if config.shared else config.replicas
        self._pools = [LRUTier(config.pool_bytes // pools) for _ in range(pools)]
        self._pool_tier = TIER_POOL if config.shared else TIER_PRIVATE_POOL
        self._page_bytes = config.model.page_bytes(config.page_tokens)
        self._router = make_router(config.router, config.seed)
        self._injector = Injector(config.faults, config.seed)
        self._ids = random.Random(f"{config.seed}:ids")
        self._events: list[tuple[int, int, str, object]] = []
        self._seq = itertools.count()
        self._fleet = [_Replica(i, f"r{i + 1}", config.local_bytes) for i in range(config.replicas)]
        self._records: list[RequestRecord] = []
        self._free_no_reuse_ns = [0] * config.replicas
        self._truth: list[GroundTruth] = []
        self._page_truth = PageTruthRecorder()
        self._end_ns = EPOCH_NS + int(config.duration_s * NS)
        if out is not None:
            (out / TRACES_DIR).mkdir(parents=True, exist_ok=True)
        for replica in self._fleet:
            self._open_emitter(replica, LAYOUT_SPLIT, VERSION_BEFORE)

    # --- FleetView, for the router --------------------------------------------------

    def cached_prefix(self, replica: int, keys: Sequence[str]) -> int:
        rep = self._fleet[replica]
        count = 0
        for key in map(rep.pool_key, keys):
            entry = self._pool(rep).peek(key)
            held = key in rep.local if rep.local is not None else entry is not None and entry.producer == rep.name
            if not held:
                break
            count += 1
        return count

    def backlog(self, replica: int) -> int:
        rep = self._fleet[replica]
        return len(rep.queue) + (rep.running is not None)

    # --- the loop ---------------------------------------------------------------------

    def run(self) -> SimResult:
        arrivals = random.Random(f"{self.config.seed}:arrivals")
        t, index = EPOCH_NS, 0
        while True:
            t += int(arrivals.expovariate(self.config.rate) * NS)
            if t >= self._end_ns:
                break
            self._push(t, "arrive", new_session(index, self.config.mix, self.config.seed, self.config.page_tokens))
            index += 1
        while self._events:
            now, _, kind, subject = heapq.heappop(self._events)
            if kind == "arrive":
                assert isinstance(subject, Session)
                self._arrive(now, subject)
            elif kind == "store":
                assert isinstance(subject, tuple)
                self._store(now, *subject)
            else:
                assert isinstance(subject, _Replica)
                self._finish(now, subject)
        for replica in self._fleet:
            replica.emitter.shutdown()
        files = sorted((self.out / TRACES_DIR).glob("*.jsonl")) if self.out is not None else []
        pages = self._page_truth.records()
        if self.out is not None:
            write_records(self.out / GROUND_TRUTH_FILE, self._truth)
            write_records(self.out / PAGE_TRUTH_FILE, pages)
        return SimResult(self.config, self._records, self._truth, files, pages)

    def _pool(self, replica: _Replica) -> LRUTier:
        return self._pools[replica.index % len(self._pools)]

    def _push(self, time_ns: int, kind: str, subject: object) -> None:
        heapq.heappush(self._events, (time_ns, next(self._seq), kind, subject))

    def _arrive(self, now: int, session: Session) -> None:
        turn = next_prompt(session)
        if turn is None:
            return
        keys = session.stream.page_keys()
        replica = self._fleet[self._router.route(session.id, keys, self)]
        record = RequestRecord(
            f"{session.id}-t{session.next_turn}",
            session.id,
            session.workload,
            replica.name,
            list(keys),
            session.stream.tokens,
            now,
        )
        # The baseline: a fleet without any reuse running full prefills for the same
        # arrivals, routed round-robin so that every router is measured against it.
        record.prefill_no_reuse_s = self.config.cost.prefill_s(self.config.model, record.tokens)
        baseline = len(self._records) % self.replicas
        start = max(now, self._free_no_reuse_ns[baseline])
        self._free_no_reuse_ns[baseline] = start + self._ns(record.prefill_no_reuse_s)
        record.ttft_no_reuse_s = (self._free_no_reuse_ns[baseline] - now) / NS
        parent = SpanContext(
            self._ids.getrandbits(128) or 1, self._ids.getrandbits(64) or 1, False, TraceFlags(TraceFlags.SAMPLED)
        )
        replica.queue.append(_Request(record, session, turn.output_tokens, turn.think_s, parent))
        self._records.append(record)
        if replica.running is None:
            self._start(now, replica)

    def _start(self, now: int, replica: _Replica) -> None:
        request = replica.running = replica.queue.popleft()
        self._maybe_upgrade(now, replica)
        record, cost, model = request.record, self.config.cost, self.config.model
        record.start_ns = now
        # The keys as this replica makes them (with prevention, its geometry's tag): the
        # lookup, the traces, the stores and the page truth all name pages by these.
        record.keys = [replica.pool_key(key) for key in record.keys]
        hits = self._lookup(replica, record.keys)
        page_tokens = self.config.page_tokens
        record.lookup_hit_tokens = len(hits) * page_tokens
        lookup_end = now + self._ns(cost.lookup_s)
        lookup = self._operation(replica, Op.LOOKUP, now, request, tokens_requested=record.tokens)
        for index, key in enumerate(record.keys):  # the prompt's pages, as a vLLM lookup names them
            lookup.add_page(self._prompt_page(replica.kv, key, index), time_ns=now)
        lookup.end(
            _outcome(len(hits), record.lookup_hit_tokens, record.tokens),
            tokens_hit=record.lookup_hit_tokens,
            pages=len(hits),
            bytes=len(hits) * self._page_bytes,
            end_ns=lookup_end,
        )
        fetch = self._operation(replica, Op.FETCH, lookup_end, request, tokens_requested=record.tokens)
        t = lookup_end
        fetched: list[Fetched] = []
        for index, (entry, tier) in enumerate(hits):
            page, fault = self._injector.serve(entry.page, tier, replica.kv)
            # As in the engines, the first page the guard refuses breaks the prefix: later ones are not used either.
            prefix_intact = not fetched or fetched[-1].used
            used = prefix_intact and (not self.config.faults.guard or self._injector.accepts(page, replica.kv))
            fetched.append(Fetched(entry, tier, used))
            page = msgspec.structs.replace(page, used=used)
            seconds = cost.transfer_s(entry.nbytes, local=tier == TIER_LOCAL)
            record.transfer_s += seconds
            record.fetched_bytes += entry.nbytes
            t += self._ns(seconds)
            fetch.add_page(page, time_ns=t)
            if used:
                record.used_tokens += page_tokens
                record.cross_tokens += page_tokens if entry.producer != replica.name else 0
            else:
                record.rejected_tokens += page_tokens
                request.computed.append(index)
            if fault is not None:
                self._truth.append(self._fault(fault, replica, request, entry, page, t))
        fetch.end(_outcome(len(hits), record.used_tokens, record.tokens), tokens_hit=record.used_tokens, end_ns=t)
        request.computed.extend(range(len(hits), len(record.keys)))
        achievable = self._page_truth.lookup(
            now,
            record.request_id,
            replica.name,
            replica.kv,
            record.keys,
            page_tokens,
            fetched,
            reachable=self._reachable(replica),
            elsewhere=self._elsewhere(replica),
        )
        record.achievable_tokens = achievable * page_tokens
        # The used pages are a prefix of the prompt: the rest is prefilled after them.
        record.prefill_s = cost.prefill_s(model, record.tokens - record.used_tokens, record.used_tokens)
        record.finish_ns = t + self._ns(record.prefill_s)
        record.ttft_s = (record.finish_ns - record.arrival_ns) / NS
        self._push(record.finish_ns, "finish", replica)

    def _lookup(self, replica: _Replica, keys: list[str]) -> list[tuple[Entry, str]]:
        """The longest prefix of `keys` held by the local tier or the pool (touching each as used)."""
        hits: list[tuple[Entry, str]] = []
        for key in keys:
            local = replica.local.get(key) if replica.local is not None else None
            entry = local or self._pool(replica).get(key)
            if entry is None:
                break
            hits.append((entry, TIER_LOCAL if local else self._pool_tier))
        return hits

    def _reachable(self, replica: _Replica) -> list[LRUTier]:
        """The tiers `replica` looks pages up in: its local tier, then its pool."""
        return [tier for tier in (replica.local, self._pool(replica)) if tier is not None]

    def _elsewhere(self, replica: _Replica) -> list[LRUTier]:
        """Every tier of the fleet that `replica` cannot look in."""
        mine = self._reachable(replica)
        tiers = [r.local for r in self._fleet if r.local is not None] + self._pools
        return [tier for tier in tiers if all(tier is not own for own in mine)]

    def _finish(self, now: int, replica: _Replica) -> None:
        request, replica.running = replica.running, None
        assert request is not None
        delay_s = self.config.faults.store_delay_s
        if delay_s:
            self._push(now + self._ns(delay_s), "store", (replica, request))
        else:
            self._store(now, replica, request)
        decode_s = request.output_tokens * self.config.cost.decode_s_per_token
        next_arrival = now + self._ns(decode_s + request.think_s)
        if next_arrival < self._end_ns:
            self._push(next_arrival, "arrive", request.session)
        if replica.queue:
            self._start(now, replica)

    def _store(self, now: int, replica: _Replica, request: _Request) -> None:
        """Put the pages this request computed, and trace what was written and what that evicted."""
        written, evicted = self._put(now, replica, request)
        for backend, pages in written.items():
            if pages:
                store = self._operation(replica, Op.STORE, now, request, backend=backend)
                for page, at in pages:
                    store.add_page(page, time_ns=at)  # visible in the tier from `at` on
                seconds = self.config.cost.transfer_s(len(pages) * self._page_bytes, local=backend == LOCAL_BACKEND)
                store.end(tokens_stored=len(pages) * self.config.page_tokens, end_ns=now + self._ns(seconds))
        for backend, entries in evicted.items():
            if entries:
                # The request whose store pushed the pages out is the evict span's request.
                evict = self._operation(
                    replica,
                    Op.EVICT,
                    now,
                    request,
                    backend=backend,
                    attributes={SpanAttr.EVICT_REASON: EvictReason.CAPACITY.value},
                )
                for entry, at in entries:
                    evict.add_page(entry.page, time_ns=at)
                evict.end(end_ns=now)

    def _put(
        self, now: int, replica: _Replica, request: _Request
    ) -> tuple[dict[str, list[tuple[PageDescriptor, int]]], dict[str, list[tuple[Entry, int]]]]:
        """Put the pages this request computed into its local tier and its pool; a key already
        present in a tier is only touched there (never rewritten).

        Each put has an instant of its own, one nanosecond apart and ending at `now`, shared
        by the evictions that made room for it: a page evicted and written again within one
        store (or written and evicted) shows in the trace in the order it happened.

        Returns:
            What each backend wrote, and what it evicted, with their instants.
        """
        written: dict[str, list[tuple[PageDescriptor, int]]] = {POOL_BACKEND: [], LOCAL_BACKEND: []}
        evicted: dict[str, list[tuple[Entry, int]]] = {POOL_BACKEND: [], LOCAL_BACKEND: []}
        record = request.record
        tiers = [(LOCAL_BACKEND, replica.local, TIER_LOCAL), (POOL_BACKEND, self._pool(replica), self._pool_tier)]
        puts = [(index, tier) for index in request.computed for tier in tiers if tier[1] is not None]
        for n, (index, (backend, tier, tier_name)) in enumerate(puts, start=1 - len(puts)):
            key, at = record.keys[index], now + n
            page = self._page(replica.kv, key, index, tier_name)
            dropped = tier.put(key, Entry(page, replica.name, self._page_bytes, at))
            if dropped is not None:
                written[backend].append((page, at))
                evicted[backend].extend((entry, at) for entry in dropped)
                self._page_truth.written(key, at, record.request_id, record.start_ns)
        return written, evicted

    def _page(self, kv: KVConfig, key: str, index: int, tier: str) -> PageDescriptor:
        tokens = self.config.page_tokens
        return PageDescriptor.from_config(
            kv,
            key=key,
            token_start=index * tokens,
            token_end=(index + 1) * tokens,
            shape=self.config.model.page_shape(kv.layout or LAYOUT_SPLIT, tokens),
            bytes=self._page_bytes,
            tier=tier,
        )

    def _prompt_page(self, kv: KVConfig, key: str, index: int) -> PageDescriptor:
        """A page of the prompt as a lookup names it: its key and tokens."""
        tokens = self.config.page_tokens
        return PageDescriptor(
            key=key, hash_algo=kv.hash_algo, token_start=index * tokens, token_end=(index + 1) * tokens
        )

    # --- emission helpers ------------------------------------------------------------------

    def _open_emitter(self, replica: _Replica, layout: str, version: str) -> None:
        replica.kv = self.config.model.kv_config(layout, self.config.page_tokens)
        if self.config.faults.prevent:
            # Spelled as LMCache spells a tagged key (`...@kvaudit_geometry%<fingerprint>`).
            replica.key_suffix = f"@{GEOMETRY_TAG}%{replica.kv.geometry}"
        options = {"engine": ENGINE, "engine_version": version, "service_name": "kvaudit-simulator", "kv": replica.kv}
        if self.out is None:
            replica.emitter = Emitter(replica_resource(replica.name, **options), SpanBatcher(_Discard()))
        else:
            replica.emitter = setup_emitter(
                replica.name,
                f"file:{self.out / TRACES_DIR}/{replica.name}.jsonl",
                max_queue_spans=4 * FLUSH_EVERY,
                **options,
            )

    def _maybe_upgrade(self, now: int, replica: _Replica) -> None:
        """The last replica restarts with the packed layout once the upgrade time has come and it is idle."""
        at = self.config.faults.upgrade_at_s
        if at is None or replica.upgraded or replica.index != self.replicas - 1 or now < EPOCH_NS + at * NS:
            return
        replica.upgraded = True
        replica.emitter.shutdown()  # the old process exits, releasing its trace file
        self._open_emitter(replica, LAYOUT_PACKED, VERSION_UPGRADED)

    def _operation(
        self,
        replica: _Replica,
        op: Op,
        start_ns: int,
        request: _Request | None = None,
        *,
        backend: str = POOL_BACKEND,
        tokens_requested: int | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> Operation:
        """Start an operation on `replica`'s emitter, in simulated time, under the request's trace."""
        replica.spans += 1
        if replica.spans % FLUSH_EVERY == 0:
            replica.emitter.flush()
        return replica.emitter.operation(
            op,
            hook=Hook.SIMULATOR,
            request_id=request.record.request_id if request else None,
            backend=backend,
            tokens_requested=tokens_requested,
            parent=request.parent if request else None,
            attributes=attributes,
            start_ns=start_ns,
        )

    def _fault(
        self, fault: str, replica: _Replica, request: _Request, entry: Entry, page: PageDescriptor, t: int
    ) -> GroundTruth:
        return GroundTruth(
            fault=fault,
            replica=replica.name,
            request_id=request.record.request_id,
            trace_id=f"{request.parent.trace_id:032x}",
            key=entry.page.key or "",
            token_start=entry.page.token_start or 0,
            time_ns=t,
            used=bool(page.used),
            producer=entry.producer,
            page_layout=page.layout,
            consumer_layout=replica.kv.layout,
        )

    @staticmethod
    def _ns(seconds: float) -> int:
        return int(seconds * NS)


def _outcome(pages: int, used_tokens: int, tokens: int) -> Outcome:
    if not pages:
        return Outcome.MISS
    if not used_tokens:
        return Outcome.REJECTED
    return Outcome.HIT if used_tokens >= tokens else Outcome.PARTIAL


def simulate(config: SimConfig, out: Path | None = None) -> SimResult:
    """Run one simulation; trace files and the ground truth go under `out` when given."""
    return Simulation(config, out).run()
