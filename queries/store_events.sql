-- store_events: every store and eviction of a page, in the store it concerns: which copy an eviction ended.
--
-- Question: none; the rule that `explain`, `explain_evictions` and `evictions/occupancy`
--   share for what a store wrote and an eviction ended (docs/design.md section 7.1). A
--   store is a backend with a tier; an LMCache store span names all its targets at once,
--   comma-separated, and its pages carry no tier (one page went to several tiers), while
--   LMCache's evictions name the tier of their one backend. So each target of a store is
--   a row of its own, and a store or eviction without a tier takes the tier that
--   evictions from the same backend name on the same replica: LMCache's capacity
--   eviction from `lmcache.local_cpu` ends the copy its store put there.
-- Parameters: none.
-- Columns: key, op (store, evict), time_ns, seq (orders events: by time, evictions first
--   at equal times, a store makes room then writes; a lookup at time T sees every event of
--   seq <= 2T + 1), replica, request_id, trace_id, span_id, backend (one target; '' for
--   none), tier ('' for none), holder (the replica whose store it is; '' for the shared
--   pool, tier `remote`), kv_group (the KV cache group whose copy it is; 0 where the page
--   names none, a model with one group), and the page's descriptor: model, dtype, layout, world_size,
--   rank, hash_algo, layers, kv_heads, head_size, bytes. In no particular order: the
--   queries that include it filter it by key, which an ORDER BY here would keep from
--   reaching the pages (a full sort of every store and eviction, for one request).
WITH targets AS (
    SELECT key, coalesce(kv_group, 0) AS kv_group, op, time_ns, replica, request_id, trace_id, span_id, tier,
           unnest(string_split(coalesce(backend, ''), ',')) AS backend,
           model, dtype, layout, world_size, rank, hash_algo, layers, kv_heads, head_size, bytes
    FROM pages
    WHERE op IN ('store', 'evict')
),
backend_tiers AS (
    -- The tier each backend's evictions name on each replica (an eviction is from one backend).
    SELECT replica, backend, max(tier) AS tier
    FROM pages
    WHERE op = 'evict' AND tier IS NOT NULL AND backend IS NOT NULL
    GROUP BY replica, backend
)
SELECT t.key, t.kv_group, t.op, t.time_ns, t.time_ns * 2 + CASE WHEN t.op = 'store' THEN 1 ELSE 0 END AS seq,
       t.replica, t.request_id, t.trace_id, t.span_id, t.backend,
       coalesce(t.tier, b.tier, '') AS tier,
       CASE WHEN coalesce(t.tier, b.tier) = 'remote' THEN '' ELSE t.replica END AS holder,
       t.model, t.dtype, t.layout, t.world_size, t.rank, t.hash_algo, t.layers, t.kv_heads, t.head_size, t.bytes
FROM targets t
LEFT JOIN backend_tiers b ON b.replica = t.replica AND b.backend = t.backend
