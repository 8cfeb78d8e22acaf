-- tui/reuse_joined: the figures of `tui/reuse`, joined from the pages themselves.
--
-- Question: as `tui/reuse`: whose pages did each replica fetch, how many did it use, and how
--           many did it reject?
-- Parameters: kvaudit_since_ns (window start, Unix ns; 0 for everything; the window starts at
--             the whole second, as in `tui/reuse`), kvaudit_skew_ns (clock skew allowed
--             between replicas, ns).
-- Columns: as `tui/reuse`.
-- The TUI reads this over a backend whose rows it does not see arrive (ClickHouse fed by the
-- Collector), where it keeps no producer index: each refresh joins the window's fetches to
-- the earliest store of their keys over the whole trace, the join the index keeps current.
WITH first_store AS (
    SELECT key, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
),
fetches AS (
    SELECT CASE WHEN s.stored_ns <= p.time_ns + getvariable('kvaudit_skew_ns') THEN s.producer END AS producer,
           p.replica AS consumer, p.used, p.token_end - p.token_start AS tokens, p.bytes
    FROM pages p
    LEFT JOIN first_store s ON s.key = p.key
    -- A page served through a layer below (`source_key`) counts once, as that layer's page;
    -- through LMCache's multiprocess server, as the consumer's block (as in `cross_replica_reuse`).
    WHERE p.op = 'fetch' AND p.hook <> 'lmcache.mp_server'
      AND (p.source_key IS NULL OR p.backend = 'vllm.LMCacheMPConnector')
      AND p.time_ns >= getvariable('kvaudit_since_ns') // 1000000000 * 1000000000
)
SELECT producer,
       consumer,
       count(*)::BIGINT AS pages,
       count(*) FILTER (WHERE used)::BIGINT AS used_pages,
       count(*) FILTER (WHERE NOT used)::BIGINT AS rejected_pages,
       coalesce(sum(tokens) FILTER (WHERE used), 0)::BIGINT AS used_tokens,
       coalesce(sum(bytes) FILTER (WHERE used), 0)::BIGINT AS used_bytes
FROM fetches
GROUP BY ALL
ORDER BY producer NULLS LAST, consumer;
