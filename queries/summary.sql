-- summary: pages stored and fetched per replica, hit rate and cross-replica fetches.
--
-- Question: how much does each replica put into the shared pool and take out of it,
--           and how much of what it takes was produced by another replica?
-- Parameters: none.
-- Columns: replica, pages_stored, pages_fetched, tokens_requested, tokens_hit,
--          hit_rate (tokens hit / tokens requested over fetch spans),
--          cross_replica_fetches (fetched pages whose earliest earlier store of the
--          same key came from another replica).
WITH first_store AS (
    -- By key id (the key itself on DuckDB, its stored hash on ClickHouse, whose hash
    -- tables take strings at a third of the speed); a NULL key is never joined.
    SELECT key_id(key) AS key_id, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key_id(key)
),
fetched AS (
    SELECT p.replica, count(*) AS pages_fetched,
           count(*) FILTER (WHERE f.stored_ns <= p.time_ns AND f.producer <> p.replica) AS cross_replica_fetches
    FROM pages p
    -- On the key alone (one first store per key), the time compared after: an equi-join,
    -- which ClickHouse runs as a plain hash join (a join on a range too is slower there).
    LEFT JOIN first_store f ON f.key_id = key_id(p.key)
    WHERE p.op = 'fetch'
    GROUP BY p.replica
),
stored AS (
    SELECT replica, count(*) AS pages_stored FROM pages WHERE op = 'store' GROUP BY replica
),
requested AS (
    SELECT replica, sum(tokens_requested) AS tokens_requested, sum(tokens_hit) AS tokens_hit
    FROM spans
    WHERE op = 'fetch'
    GROUP BY replica
)
SELECT r.replica,
       coalesce(s.pages_stored, 0) AS pages_stored,
       coalesce(f.pages_fetched, 0) AS pages_fetched,
       coalesce(q.tokens_requested, 0) AS tokens_requested,
       coalesce(q.tokens_hit, 0) AS tokens_hit,
       round(coalesce(q.tokens_hit, 0) / nullif(q.tokens_requested, 0), 3) AS hit_rate,
       coalesce(f.cross_replica_fetches, 0) AS cross_replica_fetches
FROM (SELECT DISTINCT replica FROM spans WHERE op IS NOT NULL) r
LEFT JOIN stored s USING (replica)
LEFT JOIN fetched f USING (replica)
LEFT JOIN requested q USING (replica)
ORDER BY r.replica;
