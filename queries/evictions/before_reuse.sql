-- evictions/before_reuse: pages evicted before their next use.
--
-- Question: which evictions cost something, because the page was needed again after it
--           left (and so was computed again, or fetched from somewhere else)?
-- A page's next use is the first later store, fetch or lookup of the same key on the
-- same replica: every store kvaudit sees evicting (vLLM's GPU prefix cache, LMCache's
-- in-process CPU and disk backends) belongs to one replica. A store after an eviction is
-- the page computed (or loaded) again; vLLM also reports a prefix-cache hit as a store
-- when a request asks for `kv_cache_report_mode="full"`. Evictions with no later use are
-- not listed: as far as the traces reach, they were harmless.
-- Parameters: none.
-- Columns: replica, backend, tier, key, token_start, token_end, reason (the evict
--          reason, NULL where the source does not say), evicted_at, next_use_at,
--          next_use_op, next_use_backend, next_use_tier, reuse_distance_ms.
WITH evicted AS (
    SELECT p.replica, p.backend, p.tier, p.key, p.token_start, p.token_end, s.evict_reason AS reason, p.time_ns
    FROM pages p
    JOIN spans s USING (trace_id, span_id)
    WHERE p.op = 'evict'
),
used AS (
    SELECT replica, key, time_ns, op, backend, tier
    FROM pages
    WHERE op IN ('store', 'fetch', 'lookup')
)
SELECT e.replica, e.backend, e.tier, e.key, e.token_start, e.token_end, e.reason,
       make_timestamp_ns(e.time_ns) AS evicted_at,
       make_timestamp_ns(u.time_ns) AS next_use_at,
       u.op AS next_use_op, u.backend AS next_use_backend, u.tier AS next_use_tier,
       (u.time_ns - e.time_ns) / 1e6 AS reuse_distance_ms
FROM evicted e
ASOF JOIN used u ON u.replica = e.replica AND u.key = e.key AND u.time_ns > e.time_ns
ORDER BY e.replica, e.time_ns, e.token_start, e.key;
