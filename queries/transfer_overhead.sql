-- transfer_overhead: what moving KV pages costs, and whether loading beat recomputing.
--
-- Question: how long do fetches and stores take (p50, p90, p99), how many bytes move at
--           what throughput, per replica and backend; and per token, is loading cheaper
--           than recomputing the prefill? Recompute time per token is estimated as
--           2 x parameters FLOPs at the GPU's effective FLOP rate (docs/design.md section 5:
--           27B at ~500 TFLOP/s is about 0.11 ms per token).
-- Parameters: kvaudit_model_params (DOUBLE, default 27e9): model parameters.
--             kvaudit_gpu_flops (DOUBLE, default 500e12): effective FLOP/s of prefill.
-- Columns: replica, op (fetch or store), backend, operations (spans that moved bytes),
--          pages, bytes, p50_ms, p90_ms, p99_ms (span duration), gb_per_s (bytes over
--          summed durations), tokens (hit for fetches, stored for stores),
--          ms_per_token (summed durations / tokens), recompute_ms_per_token,
--          slower_than_recompute (share of fetches whose duration exceeded recomputing
--          their hit tokens; NULL for stores).
WITH moved AS (
    SELECT replica, op, backend, pages, bytes, duration_ms,
           CASE WHEN op = 'fetch' THEN tokens_hit ELSE tokens_stored END AS tokens,
           2 * coalesce(getvariable('kvaudit_model_params'), 27e9)
             / coalesce(getvariable('kvaudit_gpu_flops'), 500e12) * 1e3 AS recompute_ms_per_token
    FROM spans
    WHERE op IN ('fetch', 'store') AND bytes > 0
)
SELECT replica,
       op,
       backend,
       count(*) AS operations,
       sum(pages) AS pages,
       sum(bytes) AS bytes,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_ms) AS p90_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ms) AS p99_ms,
       sum(bytes) / nullif(sum(duration_ms), 0) / 1e6 AS gb_per_s,
       sum(tokens) AS tokens,
       sum(duration_ms) / nullif(sum(tokens), 0) AS ms_per_token,
       max(recompute_ms_per_token) AS recompute_ms_per_token,
       CASE WHEN op = 'fetch'
            THEN avg(CASE WHEN duration_ms > tokens * recompute_ms_per_token THEN 1.0 ELSE 0.0 END) END
           AS slower_than_recompute
FROM moved
GROUP BY replica, op, backend
ORDER BY replica, op, backend;
