-- reuse_left: the reuse the fleet left on the table, per replica and time bucket: the hit rate beside the achievable one, and the missed tokens by cause.
-- Includes: reuse_left_requests AS per_request
--
-- Question: how much more could each replica have reused, and what stood in the way? For
--   every request (queries/reuse_left_requests.sql, read here as `per_request`), the
--   longest prefix of which a compatible copy existed anywhere in the fleet at its lookup
--   (any replica's GPU cache or local tier, or the pool) against the prefix it actually
--   used; summed per replica and bucket of lookup time, with the prompt tokens of the
--   pages each cause of docs/design.md section 7 kept from being used. `routed_away` is the reuse lost to
--   routing, `evicted` to capacity.
-- Parameters: kvaudit_bucket_s (DOUBLE, default 60): width of a time bucket in seconds;
--   and explain's (kvaudit_request_id, kvaudit_replica, kvaudit_trace_id, kvaudit_since_ns: unset,
--   every request).
-- Columns: replica, bucket_start (TIMESTAMP WITH TIME ZONE), requests, prompt_tokens, hit_tokens,
--   achievable_tokens, hit_rate, achievable_rate, lost_rate (achievable_rate - hit_rate), and
--   the tokens of the missed pages per cause: rejected, prefix_broken, routed_away,
--   incompatible_producer, evicted, stored_after_lookup, never_stored.
WITH bucketed AS (
    SELECT *, lookup_ns - lookup_ns % CAST(coalesce(getvariable('kvaudit_bucket_s'), 60) * 1e9 AS BIGINT) AS bucket_ns
    FROM per_request
)
SELECT replica,
       to_timestamp(bucket_ns / 1e9) AS bucket_start,
       count(*) AS requests,
       sum(prompt_tokens) AS prompt_tokens,
       sum(hit_tokens) AS hit_tokens,
       sum(achievable_tokens) AS achievable_tokens,
       sum(hit_tokens) / nullif(sum(prompt_tokens), 0) AS hit_rate,
       sum(achievable_tokens) / nullif(sum(prompt_tokens), 0) AS achievable_rate,
       (sum(achievable_tokens) - sum(hit_tokens)) / nullif(sum(prompt_tokens), 0) AS lost_rate,
       sum(rejected) AS rejected,
       sum(prefix_broken) AS prefix_broken,
       sum(routed_away) AS routed_away,
       sum(incompatible_producer) AS incompatible_producer,
       sum(evicted) AS evicted,
       sum(stored_after_lookup) AS stored_after_lookup,
       sum(never_stored) AS never_stored
FROM bucketed
GROUP BY replica, bucket_ns
ORDER BY replica, bucket_ns
