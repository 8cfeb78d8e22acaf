-- evictions/rates: eviction rate against hit rate, per replica over time.
--
-- Question: does the pool thrash: do evictions rise as the hit rate falls?
-- Evictions are pages evicted from any of the replica's stores (GPU prefix cache,
-- LMCache backends); the hit rate is tokens hit over tokens requested by its fetch spans,
-- as in `summary`. The trace window is cut into about 60 intervals of at least one second.
-- Parameters: none.
-- Columns: replica, interval_start, seconds, evicted_pages, evictions_per_s,
--          stored_pages, tokens_requested, tokens_hit, hit_rate.
WITH window_ AS (
    SELECT min(start_ns) AS t0, greatest((max(start_ns) - min(start_ns)) // 60, 1000000000) AS width
    FROM spans
    WHERE op IS NOT NULL
),
per_interval AS (
    SELECT replica, t0 + (start_ns - t0) // width * width AS interval_ns, width,
           sum(pages) FILTER (WHERE op = 'evict') AS evicted_pages,
           sum(pages) FILTER (WHERE op = 'store') AS stored_pages,
           sum(tokens_requested) FILTER (WHERE op = 'fetch') AS tokens_requested,
           sum(tokens_hit) FILTER (WHERE op = 'fetch') AS tokens_hit
    FROM spans, window_
    WHERE op IS NOT NULL
    GROUP BY ALL
)
SELECT replica, make_timestamp_ns(interval_ns) AS interval_start, width / 1e9 AS seconds,
       coalesce(evicted_pages, 0) AS evicted_pages,
       round(coalesce(evicted_pages, 0) / (width / 1e9), 3) AS evictions_per_s,
       coalesce(stored_pages, 0) AS stored_pages,
       coalesce(tokens_requested, 0) AS tokens_requested,
       coalesce(tokens_hit, 0) AS tokens_hit,
       round(tokens_hit / nullif(tokens_requested, 0), 3) AS hit_rate
FROM per_interval
ORDER BY replica, interval_start;
