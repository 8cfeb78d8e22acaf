"""A fleet's history generated straight into a live store's tables, for the benchmarks of what reads it live.

Decoding JSON is the reader's benchmark, not theirs. Four replicas of a 27B model: half the
spans store 32 pages, each fetch span reads the pages the store span just before it wrote
(another replica's), one fetched page in fifty is rejected; one fetched page in 10,000
has another dtype than its store (KVA004, KVA005) and one fetch span in 1,000 asks for
keys nobody stored (KVA006): a fleet whose audit finds something, as a real one's does.
Spans follow one another `span_ns` apart from 2026-01-01, so later calls append to the
same history.
"""

from __future__ import annotations

from typing import Final

from kvaudit.read.store import TraceStore

PAGES_PER_SPAN: Final = 32
REPLICAS: Final = 4
HOUR_NS: Final = 3600 * 10**9
START_NS: Final = 1_767_225_600_000_000_000
# Gemma-2-27B's page of 256 tokens: [2, 46 layers, 256 tokens, 16 heads x 128] in bfloat16.
SHAPE: Final = [2, 46, 256, 2048]
PAGE_BYTES: Final = 2 * 46 * 256 * 2048 * 2

_RESOURCES: Final = f"""
INSERT INTO kv_resources BY NAME
SELECT r AS resource_id, 'r' || r AS replica, 'vllm' AS service, 1 AS schema, 'vllm' AS engine,
       'google/gemma-2-27b' AS model, 'bfloat16' AS dtype, 'NB_2_BS_NH_HS' AS layout
FROM range({REPLICAS}) t(r)"""
_SPANS: Final = f"""
INSERT INTO kv_spans BY NAME
SELECT 'bench' AS file, s AS line, s % {REPLICAS} AS resource_id, 'r' || (s % {REPLICAS}) AS replica,
       printf('%032x', s) AS trace_id, printf('%016x', s) AS span_id,
       CASE WHEN s % 2 = 0 THEN 'kvaudit.store' ELSE 'kvaudit.fetch' END AS name,
       {START_NS} + s * $span_ns AS start_ns,
       {START_NS} + s * $span_ns + 2_000_000 + (s % 97) * 50_000 AS end_ns,
       0 AS status_code, 0 AS dropped_attributes, 0 AS dropped_events,
       CASE WHEN s % 2 = 0 THEN 'store' ELSE 'fetch' END AS op, 'req-' || (s // 2) AS request_id,
       'vllm.connector' AS hook, 'lmcache.remote' AS backend,
       {PAGES_PER_SPAN * 256} AS tokens_requested,
       CASE WHEN s % 2 = 1 THEN {PAGES_PER_SPAN * 256} - (s % 3) * 256 END AS tokens_hit,
       CASE WHEN s % 2 = 0 THEN {PAGES_PER_SPAN * 256} END AS tokens_stored,
       {PAGES_PER_SPAN} AS pages, {PAGES_PER_SPAN} * {PAGE_BYTES}::BIGINT AS bytes, 'hit' AS outcome
FROM range($first, $last) t(s)"""
_PAGES: Final = f"""
INSERT INTO kv_pages BY NAME
SELECT 'bench' AS file, s AS line, s % {REPLICAS} AS resource_id, 'r' || (s % {REPLICAS}) AS replica,
       printf('%032x', s) AS trace_id, printf('%016x', s) AS span_id,
       CASE WHEN s % 2 = 0 THEN 'store' ELSE 'fetch' END AS op, 'vllm.connector' AS hook,
       'lmcache.remote' AS backend, 'req-' || (s // 2) AS request_id, 'hit' AS outcome,
       {START_NS} + s * $span_ns + p % {PAGES_PER_SPAN} AS time_ns,
       -- a fetch span reads the pages the store span just before it wrote, or (one in 1,000) keys never stored
       md5(CASE WHEN s % 2000 = 1 THEN 'never-' ELSE '' END
           || ((s // 2) * {PAGES_PER_SPAN} + p % {PAGES_PER_SPAN})::VARCHAR) AS key,
       'sha256_cbor' AS hash_algo, (p % {PAGES_PER_SPAN}) * 256 AS token_start,
       (p % {PAGES_PER_SPAN} + 1) * 256 AS token_end, 'google/gemma-2-27b' AS model,
       CASE WHEN s % 2 = 1 AND p % 10_000 = 1 THEN 'float16' ELSE 'bfloat16' END AS dtype,
       {SHAPE} AS shape, 'NB_2_BS_NH_HS' AS layout, {PAGE_BYTES} AS bytes, 1 AS world_size, 0 AS rank,
       46 AS layers, 16 AS kv_heads, 128 AS head_size,
       CASE WHEN s % 2 = 1 THEN p % 50 <> 0 END AS used, 'cpu' AS tier
FROM (SELECT p, p // {PAGES_PER_SPAN} AS s FROM range($first * {PAGES_PER_SPAN}, $last * {PAGES_PER_SPAN}) t(p))"""


def generate(store: TraceStore, first_span: int, spans: int, *, span_ns: int) -> None:
    """Append spans `first_span` to `first_span + spans - 1` of the fleet's history (and, with the first,
    the replicas), with their pages, to the store's tables."""
    if first_span == 0:
        store.con.execute(_RESOURCES)
    params = {"first": first_span, "last": first_span + spans, "span_ns": span_ns}
    for statement in (_SPANS, _PAGES):
        store.con.execute(statement, params)


def span_ns_for(pages: int, *, hours: int = 1) -> int:
    """How far apart spans are for `pages` page descriptors to make `hours` of history."""
    return hours * HOUR_NS // max(pages // PAGES_PER_SPAN, 1)
