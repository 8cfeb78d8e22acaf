-- tui/activity: tokens hit per replica and time bucket (the TUI's sparklines).
--
-- Question: how has each replica's hit traffic moved over the window?
-- Parameters: kvaudit_since_ns (first bucket's start, Unix ns), kvaudit_bucket_ns (bucket width, ns).
-- Columns: replica, bucket (0-based index from kvaudit_since_ns), tokens_hit (over fetch spans
--          ending in the bucket).
SELECT replica,
       ((end_ns - getvariable('kvaudit_since_ns')) // getvariable('kvaudit_bucket_ns'))::BIGINT AS bucket,
       coalesce(sum(tokens_hit), 0) AS tokens_hit
FROM spans
WHERE op = 'fetch' AND end_ns >= getvariable('kvaudit_since_ns')
GROUP BY ALL
ORDER BY replica, bucket;
