-- latency_histogram: how fetch and store latencies are distributed.
--
-- Question: what does the latency distribution of moving pages look like per replica and
--           operation: one fast mode, or a tail (a slow backend, queueing)? Buckets are
--           powers of two in milliseconds, so the tail stays visible at any scale.
-- Parameters: none.
-- Columns: replica, op (fetch or store), bucket_ms (lower bound; durations under 1/1024 ms
--          fall in the lowest bucket), operations.
WITH timed AS (
    SELECT replica, op, greatest(duration_ms, 1.0 / 1024) AS ms
    FROM spans
    WHERE op IN ('fetch', 'store')
)
SELECT replica, op, power(2, floor(ln(ms) / ln(2))) AS bucket_ms, count(*) AS operations
FROM timed
GROUP BY replica, op, power(2, floor(ln(ms) / ln(2)))
ORDER BY replica, op, bucket_ms;
