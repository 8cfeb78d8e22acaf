-- headline: the traces in one row, as the top of the report shows them.
--
-- Question: how many replicas, over what time, serving how many requests, and how much of
--           what they asked the pool for did they get?
-- Parameters: none.
-- Columns: replicas (distinct replicas with a kvaudit operation), first_time, last_time
--          (the earliest operation's start and the latest one's end), requests (distinct
--          request ids with a kvaudit operation), tokens_requested, tokens_hit (over fetch
--          spans), hit_rate (tokens hit / tokens requested, NULL without fetches),
--          fetch_bytes (bytes fetched), pages (page descriptors read), prevented_pages
--          (for each page of tokens, the geometry fingerprints that stored it beyond the
--          first: replicas that recomputed what the pool held under another geometry, the
--          reuse prevention forwent, docs/design.md section 4.5; a prevented key carries
--          the fingerprint as its `@kvaudit_geometry%<fingerprint>` tag; counted from
--          stores, as LMCache's lookups name no pages, and untagged keys not at all).
WITH tagged AS (
    -- One row per page and geometry: its key without the tag, and the tag.
    SELECT DISTINCT regexp_replace(key, '@kvaudit_geometry%[0-9a-f]+', '') AS tokens_key,
           regexp_extract(key, '@kvaudit_geometry%([0-9a-f]+)', 1) AS geometry
    FROM pages
    WHERE op = 'store' AND contains(key, '@kvaudit_geometry%')
),
-- Every geometry of a page but the first to store it found another's copy already there.
prevented AS (SELECT count(*) - count(DISTINCT tokens_key) AS pages FROM tagged)
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
       (SELECT pages FROM prevented) AS prevented_pages
FROM spans
WHERE op IS NOT NULL;
