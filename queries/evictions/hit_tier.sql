-- evictions/hit_tier: where each block a replica's GPU cache took in came from.
--
-- Question: per block, was it a hit in the replica's own GPU prefix cache, a hit in the
--           shared pool, or a miss that was computed?
-- Rows are the GPU-tier stores of vLLM's KV events (`kvaudit collect --kv-events`): every
-- block that entered a replica's GPU cache, and every prefix-cache hit vLLM re-reports
-- (requests with `kv_cache_report_mode="full"`; in the default mode GPU hits are not in
-- the stream, and a request's GPU hits are the blocks before its first stored one).
-- A block is `gpu` when the replica already held the key, `pool` when the replica
-- fetched and used the key within the clock skew (1 s) of storing it, `miss` otherwise.
-- Parameters: none.
-- Columns: replica, time, key, token_start, token_end, served_from (gpu, pool, miss),
--          pool_backend, pool_tier (where a pool hit was fetched from).
WITH gpu AS (
    SELECT replica, backend, key, token_start, token_end, time_ns, op,
           coalesce(lag(op = 'store') OVER (PARTITION BY replica, backend, key ORDER BY time_ns), false) AS held
    FROM pages
    WHERE tier = 'gpu' AND op IN ('store', 'evict')
),
-- The fetch of each stored block nearest in time, within the skew: a join and a rank rather
-- than a correlated subquery, which ClickHouse cannot run.
nearest AS (
    SELECT g.replica, g.backend, g.key, g.token_start, g.time_ns, f.backend AS pool_backend, f.tier AS pool_tier,
           row_number() OVER (
               PARTITION BY g.replica, g.backend, g.key, g.token_start, g.time_ns
               ORDER BY abs(f.time_ns - g.time_ns), f.time_ns, f.backend, f.tier
           ) AS nearness
    FROM gpu g
    JOIN pages f ON f.replica = g.replica AND f.key = g.key
    WHERE g.op = 'store' AND f.op = 'fetch' AND f.used AND abs(f.time_ns - g.time_ns) <= 1000000000
)
SELECT g.replica, make_timestamp_ns(g.time_ns) AS time, g.key, g.token_start, g.token_end,
       CASE WHEN g.held THEN 'gpu' WHEN n.key IS NOT NULL THEN 'pool' ELSE 'miss' END AS served_from,
       n.pool_backend, n.pool_tier
FROM gpu g
LEFT JOIN nearest n
       ON n.replica = g.replica AND n.key = g.key AND n.backend IS NOT DISTINCT FROM g.backend
      AND n.token_start IS NOT DISTINCT FROM g.token_start AND n.time_ns = g.time_ns AND n.nearness = 1
WHERE g.op = 'store'
ORDER BY g.replica, g.time_ns, g.token_start, g.key;
