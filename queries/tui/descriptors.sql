-- tui/descriptors: a fetched page descriptor beside the stored one of the same key.
--
-- Question: what did the consumer actually receive, and what had the producer stored?
-- Parameters: kvaudit_span_id (the fetch span), kvaudit_key (the page key), kvaudit_skew_ns (clock skew
--             allowed between replicas, ns).
-- Columns: side ('fetched' or 'stored') and every column of the `pages` view. The stored
--          row is the earliest store of the key that precedes the fetch by at most the
--          skew (the producer join of docs/design.md section 3.7); it is absent when none exists.
WITH fetched AS (
    SELECT *
    FROM pages
    WHERE op = 'fetch' AND span_id = getvariable('kvaudit_span_id') AND key = getvariable('kvaudit_key')
    ORDER BY line
    LIMIT 1
),
stored AS (
    SELECT s.*
    FROM pages s, fetched f
    WHERE s.op = 'store' AND s.key = getvariable('kvaudit_key')
      AND s.time_ns <= f.time_ns + getvariable('kvaudit_skew_ns')
    ORDER BY s.time_ns
    LIMIT 1
)
SELECT 'fetched' AS side, * FROM fetched
UNION ALL BY NAME
SELECT 'stored' AS side, * FROM stored;
