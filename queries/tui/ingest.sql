-- tui/ingest: keep the TUI's producer index current with newly read pages (statements, in order).
--
-- Question: which replica produced each fetched page, without re-joining every fetch to
--           every store on each refresh?
-- Parameters: $skew_ns (clock skew allowed between replicas, ns). Reads `tui_new_pages`
--             (the rows of the `pages` view just read) into the tables of `tui/index`.
--             A fetch's producer is the replica of the earliest store of its key that
--             precedes it by at most the skew, NULL when none does.
-- Only the index rows of keys in the batch are looked at, so a refresh costs what it reads.
-- A store read after a fetch of the same key (another replica's file read later, or an
-- earlier clock) re-resolves that key's fetches, so reading order never changes an answer.

-- The keys whose earliest store is new or earlier than the one known.
CREATE OR REPLACE TEMP TABLE tui_changed AS
WITH batch AS (
    SELECT key, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM tui_new_pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
)
SELECT b.key, b.producer, b.stored_ns
FROM batch b
LEFT JOIN (SELECT * FROM tui_first_store WHERE key IN (SELECT key FROM batch)) f USING (key)
WHERE f.stored_ns IS NULL OR b.stored_ns < f.stored_ns;
DELETE FROM tui_first_store WHERE key IN (SELECT key FROM tui_changed);
INSERT INTO tui_first_store SELECT key, producer, stored_ns FROM tui_changed;

-- Fetches read before whose producer now changes.
CREATE OR REPLACE TEMP TABLE tui_moved AS
SELECT t.*, c.producer AS new_producer
FROM tui_fetches t
JOIN tui_changed c ON t.key = c.key
WHERE c.stored_ns <= t.time_ns + $skew_ns AND t.producer IS DISTINCT FROM c.producer;
UPDATE tui_fetches
SET producer = c.producer
FROM tui_changed c
WHERE tui_fetches.key = c.key AND c.stored_ns <= tui_fetches.time_ns + $skew_ns;

-- The new fetches, resolved against the stores known now (this batch's included). A page
-- that names the page of a layer below that served it (`source_key`) is that page's
-- transfer, counted once as the layer below's (as in `cross_replica_reuse`; through LMCache's
-- multiprocess server, as the consumer's block).
CREATE OR REPLACE TEMP TABLE tui_batch_fetches AS
SELECT n.key, n.replica AS consumer, n.time_ns, n.used, n.token_end - n.token_start AS tokens, n.bytes,
       CASE WHEN f.stored_ns <= n.time_ns + $skew_ns THEN f.producer END AS producer
FROM tui_new_pages n
LEFT JOIN (
    SELECT * FROM tui_first_store WHERE key IN (SELECT key FROM tui_new_pages WHERE op = 'fetch')
) f ON f.key = n.key
WHERE n.op = 'fetch' AND n.hook <> 'lmcache.mp_server'
  AND (n.source_key IS NULL OR n.backend = 'vllm.LMCacheMPConnector');
INSERT INTO tui_fetches SELECT * FROM tui_batch_fetches;
-- Counts by second: moved fetches off their old producer and onto the new one, new fetches on theirs.
INSERT INTO tui_reuse_ledger
SELECT producer, consumer, time_ns // 1_000_000_000, sum(sign), coalesce(sum(sign) FILTER (WHERE used), 0),
       coalesce(sum(sign) FILTER (WHERE NOT used), 0), coalesce(sum(sign * tokens) FILTER (WHERE used), 0),
       coalesce(sum(sign * bytes) FILTER (WHERE used), 0)
FROM (
    SELECT producer, consumer, time_ns, used, tokens, bytes, -1 AS sign FROM tui_moved
    UNION ALL
    SELECT new_producer, consumer, time_ns, used, tokens, bytes, 1 FROM tui_moved
    UNION ALL
    SELECT producer, consumer, time_ns, used, tokens, bytes, 1 FROM tui_batch_fetches
)
GROUP BY ALL;
