-- headline: the traces in one row, as the top of the report shows them.
-- Includes: prevented AS prevented
--
-- Question: how many replicas, over what time, serving how many requests, how much of
--           what they asked the pool for did they get, and how much did prevention keep
--           from them?
-- Parameters: none.
-- Columns: replicas (distinct replicas with a kvaudit operation), first_time, last_time
--          (the earliest operation's start and the latest one's end), requests (distinct
--          request ids with a kvaudit operation), tokens_requested, tokens_hit (over fetch
--          spans), hit_rate (tokens hit / tokens requested, NULL without fetches),
--          fetch_bytes (bytes fetched), pages (page descriptors read), prevented_pages
--          (the pages prevention kept from replicas of another geometry:
--          queries/prevented.sql).
SELECT count(DISTINCT replica) AS replicas,
       min(start_time) AS first_time,
       max(end_time) AS last_time,
       count(DISTINCT request_id) AS requests,
       coalesce(sum(tokens_requested) FILTER (WHERE op = 'fetch'), 0) AS tokens_requested,
       coalesce(sum(tokens_hit) FILTER (WHERE op = 'fetch'), 0) AS tokens_hit,
       sum(tokens_hit) FILTER (WHERE op = 'fetch') / nullif(sum(tokens_requested) FILTER (WHERE op = 'fetch'), 0)
           AS hit_rate,
       coalesce(sum(bytes) FILTER (WHERE op = 'fetch'), 0) AS fetch_bytes,
       (SELECT count(*) FROM pages) AS pages,
       (SELECT prevented_pages FROM prevented) AS prevented_pages
FROM spans
WHERE op IS NOT NULL;
