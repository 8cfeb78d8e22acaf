-- hit_rate: tokens requested and hit per replica, layer and time bucket.
--
-- Question: how much of what each replica asked the cache for did it get, over time, and
--           at which layer? The vLLM connector and LMCache (engine, backend) report
--           separately, and a lookup hit (the cache says it has the tokens) is kept apart
--           from a fetch hit (the tokens were retrieved): summing them would count twice.
-- Parameters: kvaudit_bucket_s (DOUBLE, default 60): width of a time bucket in seconds.
-- Columns: replica, hook (the layer: vllm.connector, lmcache.engine, lmcache.backend, ...),
--          op (lookup or fetch), bucket_start (TIMESTAMP WITH TIME ZONE), operations,
--          tokens_requested, tokens_hit, hit_rate (tokens_hit / tokens_requested).
WITH bucketed AS (
    SELECT replica, hook, op, tokens_requested, coalesce(tokens_hit, 0) AS tokens_hit,
           start_ns - start_ns % CAST(coalesce(getvariable('kvaudit_bucket_s'), 60) * 1e9 AS BIGINT) AS bucket_ns
    FROM spans
    WHERE op IN ('lookup', 'fetch') AND tokens_requested IS NOT NULL
)
SELECT replica,
       hook,
       op,
       to_timestamp(bucket_ns / 1e9) AS bucket_start,
       count(*) AS operations,
       sum(tokens_requested) AS tokens_requested,
       sum(tokens_hit) AS tokens_hit,
       sum(tokens_hit) / nullif(sum(tokens_requested), 0) AS hit_rate
FROM bucketed
GROUP BY replica, hook, op, bucket_ns
ORDER BY replica, hook, op, bucket_ns;
