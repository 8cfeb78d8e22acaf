-- reuse: how stored pages are used afterwards, per replica.
--
-- Question: how long after a store do its fetches come (reuse time), how much of what a
--           replica stores is never fetched (wasted stores), and how often does the pool
--           evict a page that is needed again later (evicted before its next use: the key
--           is stored or fetched again after the eviction)?
-- Parameters: kvaudit_skew_s (DOUBLE, default 1.0): allowed clock skew in seconds.
-- Columns: replica, pages_stored, bytes_stored, wasted_stores (stored pages whose key is
--          never fetched after the store), wasted_bytes, reused_pages (fetches, by any
--          replica, of pages this replica produced: the earliest earlier store of their key
--          was its; `summary`'s pages_fetched counts a replica's own fetches),
--          reuse_p50_s, reuse_p90_s, reuse_p99_s (fetch time minus producer store time),
--          evicted_pages, evicted_before_reuse.
WITH skew AS (
    SELECT CAST(coalesce(getvariable('kvaudit_skew_s'), 1.0) * 1e9 AS BIGINT) AS ns
),
first_store AS (
    SELECT key, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
),
last_fetch AS (
    SELECT key, max(time_ns) AS last_ns FROM pages WHERE op = 'fetch' GROUP BY key
),
last_access AS (
    SELECT key, max(time_ns) AS last_ns FROM pages WHERE op IN ('store', 'fetch') GROUP BY key
),
stored AS (
    SELECT s.replica, count(*) AS pages_stored, sum(s.bytes) AS bytes_stored,
           count(*) FILTER (WHERE u.last_ns IS NULL OR u.last_ns + k.ns < s.time_ns) AS wasted_stores,
           coalesce(sum(s.bytes) FILTER (WHERE u.last_ns IS NULL OR u.last_ns + k.ns < s.time_ns), 0)
             AS wasted_bytes
    FROM pages s
    CROSS JOIN skew k
    LEFT JOIN last_fetch u ON u.key = s.key
    WHERE s.op = 'store'
    GROUP BY s.replica
),
reused AS (
    SELECT f.producer AS replica, count(*) AS reused_pages,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY (p.time_ns - f.stored_ns) / 1e9) AS reuse_p50_s,
           percentile_cont(0.9) WITHIN GROUP (ORDER BY (p.time_ns - f.stored_ns) / 1e9) AS reuse_p90_s,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY (p.time_ns - f.stored_ns) / 1e9) AS reuse_p99_s
    FROM pages p
    CROSS JOIN skew k
    JOIN first_store f ON f.key = p.key AND f.stored_ns <= p.time_ns + k.ns
    WHERE p.op = 'fetch'
    GROUP BY f.producer
),
evicted AS (
    SELECT e.replica, count(*) AS evicted_pages,
           count(*) FILTER (WHERE a.last_ns > e.time_ns) AS evicted_before_reuse
    FROM pages e
    LEFT JOIN last_access a ON a.key = e.key
    WHERE e.op = 'evict'
    GROUP BY e.replica
)
SELECT r.replica,
       coalesce(s.pages_stored, 0) AS pages_stored,
       coalesce(s.bytes_stored, 0) AS bytes_stored,
       coalesce(s.wasted_stores, 0) AS wasted_stores,
       coalesce(s.wasted_bytes, 0) AS wasted_bytes,
       coalesce(u.reused_pages, 0) AS reused_pages,
       u.reuse_p50_s, u.reuse_p90_s, u.reuse_p99_s,
       coalesce(e.evicted_pages, 0) AS evicted_pages,
       coalesce(e.evicted_before_reuse, 0) AS evicted_before_reuse
FROM (SELECT DISTINCT replica FROM pages WHERE op IN ('store', 'fetch', 'evict')) r
LEFT JOIN stored s ON s.replica = r.replica
LEFT JOIN reused u ON u.replica = r.replica
LEFT JOIN evicted e ON e.replica = r.replica
ORDER BY r.replica;
