-- evictions/occupancy: pages and bytes held by each store over time.
-- Includes: store_events AS store_events
--
-- Question: how full is each replica's GPU prefix cache and each LMCache backend, and
--           when do stores and evictions move it?
-- A key is held from a store until its eviction; a store of a key already held (vLLM
-- re-reporting a prefix-cache hit) changes nothing, and an eviction of a key never seen
-- stored (the traces start after it) is counted but moves no occupancy: occupancy is
-- what the traces saw, a lower bound when they start mid-run. Bytes are the stored
-- descriptors' (vLLM's KV events carry none). The trace window is cut into about 60
-- intervals of at least one second.
-- Parameters: none.
-- Columns: replica, backend, tier (as its evictions name it), interval_start, pages
--          (held at the interval's end), bytes (idem), stored (pages that became held
--          in it), evicted (pages evicted in it).
WITH held AS (
    -- Each store target took the page (queries/store_events.sql: LMCache's stores go to all
    -- their backends at once, and take the tier their backend's evictions name).
    SELECT replica, backend, key, time_ns, op,
           max(nullif(tier, '')) OVER (PARTITION BY replica, backend) AS tier,
           (op = 'store')::INTEGER AS held,
           last_value(CASE WHEN op = 'store' THEN bytes END IGNORE NULLS) OVER by_key AS held_bytes
    FROM store_events
    WHERE backend <> ''
    WINDOW by_key AS (PARTITION BY replica, backend, key ORDER BY time_ns ROWS UNBOUNDED PRECEDING)
),
changes AS (
    SELECT *,
           held - coalesce(lag(held) OVER by_key, 0) AS d_pages,
           CASE WHEN held = 1 THEN coalesce(held_bytes, 0) ELSE coalesce(lag(held_bytes) OVER by_key, 0) END
               * (held - coalesce(lag(held) OVER by_key, 0)) AS d_bytes
    FROM held
    WINDOW by_key AS (PARTITION BY replica, backend, key ORDER BY time_ns)
),
running AS (
    SELECT *,
           sum(d_pages) OVER by_store AS pages,
           sum(d_bytes) OVER by_store AS bytes
    FROM changes
    WINDOW by_store AS (PARTITION BY replica, backend ORDER BY time_ns)
),
window_ AS (
    SELECT min(time_ns) AS t0, greatest((max(time_ns) - min(time_ns)) // 60, 1000000000) AS width FROM running
)
SELECT replica, backend, tier,
       make_timestamp_ns(t0 + (time_ns - t0) // width * width) AS interval_start,
       arg_max(pages, time_ns) AS pages,
       arg_max(bytes, time_ns) AS bytes,
       count(*) FILTER (WHERE d_pages > 0) AS stored,
       count(*) FILTER (WHERE op = 'evict') AS evicted
FROM running, window_
GROUP BY ALL
ORDER BY replica, backend, tier, interval_start;
