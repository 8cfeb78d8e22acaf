-- tui/replicas: per-replica request and fetch figures over a time window (the TUI's replica table).
--
-- Question: how busy is each replica, how much of what it asked the pool for did it get,
--           and how fast did the pool deliver it?
-- Parameters: kvaudit_since_ns (window start, Unix ns; 0 for everything).
-- Columns: replica, requests (distinct request ids with a kvaudit operation),
--          tokens_requested, tokens_hit (over fetch spans), hit_rate (tokens hit /
--          tokens requested, NULL without fetches), fetch_bytes, fetch_seconds (summed
--          fetch span durations), fetch_gbps (fetch bytes / fetch seconds / 1e9),
--          p99_fetch_ms (99th percentile fetch span duration).
-- Every replica that declared a resource has a row, active in the window or not.
WITH per_replica AS (
    SELECT replica,
           count(DISTINCT request_id) AS requests,
           sum(tokens_requested) FILTER (WHERE op = 'fetch') AS tokens_requested,
           sum(tokens_hit) FILTER (WHERE op = 'fetch') AS tokens_hit,
           sum(bytes) FILTER (WHERE op = 'fetch') AS fetch_bytes,
           sum(duration_ns) FILTER (WHERE op = 'fetch') / 1e9 AS fetch_seconds,
           quantile_cont(duration_ns, 0.99) FILTER (WHERE op = 'fetch') / 1e6 AS p99_fetch_ms
    FROM (
        SELECT replica, op, request_id, tokens_requested, tokens_hit, bytes, end_ns - start_ns AS duration_ns
        FROM spans
        WHERE op IS NOT NULL AND end_ns >= getvariable('kvaudit_since_ns')
    )
    GROUP BY replica
)
SELECT r.replica,
       coalesce(w.requests, 0) AS requests,
       coalesce(w.tokens_requested, 0) AS tokens_requested,
       coalesce(w.tokens_hit, 0) AS tokens_hit,
       w.tokens_hit / nullif(w.tokens_requested, 0) AS hit_rate,
       coalesce(w.fetch_bytes, 0) AS fetch_bytes,
       coalesce(w.fetch_seconds, 0) AS fetch_seconds,
       w.fetch_bytes / nullif(w.fetch_seconds, 0) / 1e9 AS fetch_gbps,
       w.p99_fetch_ms
FROM (SELECT DISTINCT replica FROM replicas WHERE replica IS NOT NULL) r
LEFT JOIN per_replica w USING (replica)
ORDER BY r.replica;
