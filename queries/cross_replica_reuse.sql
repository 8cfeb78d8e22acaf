-- cross_replica_reuse: who produced the pages each replica fetched.
--
-- Question: how much of the shared pool's value crosses replicas? A producer -> consumer
--           matrix of fetched pages, tokens and bytes; the producer of a fetched page is
--           the replica of the earliest store of its key, when that store precedes the
--           fetch (allowing clock skew). Only pages the consumer used count (a rejected
--           page was no hit); a page whose producer is not in the traces has producer NULL.
--           A page that names the page of a layer below that served it (`source_key`: a
--           vLLM block loaded through LMCache) is that page's transfer: each transfer
--           counts once, as the layer below's page, which carries its bytes. In LMCache's
--           multiprocess mode the layer below is the server, whose pages are the pool's and
--           name no consumer: there each transfer counts once as the consumer's vLLM block
--           (backend `vllm.LMCacheMPConnector`), and the server's pages not at all.
-- Parameters: kvaudit_skew_s (DOUBLE, default 1.0): allowed clock skew in seconds.
--             kvaudit_class_attr (VARCHAR, default unset): a further span attribute
--             (e.g. workload) whose value splits the matrix by request class; unset, all
--             fetches are one class, 'all'.
-- Columns: request_class, producer, consumer, pages, tokens, bytes,
--          crossed (producer is another replica),
--          token_share (tokens / all used fetched tokens of the class; summed over the
--          crossed rows it is the share of hit tokens that crossed replicas).
WITH first_store AS (
    SELECT key, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
),
fetched AS (
    SELECT p.replica AS consumer, p.trace_id, p.span_id,
           coalesce(p.token_end - p.token_start, 0) AS tokens, coalesce(p.bytes, 0) AS bytes,
           CASE WHEN f.stored_ns <= p.time_ns + CAST(coalesce(getvariable('kvaudit_skew_s'), 1.0) * 1e9 AS BIGINT)
                THEN f.producer END AS producer
    FROM pages p
    LEFT JOIN first_store f ON f.key = p.key
    WHERE p.op = 'fetch' AND (p.used IS NULL OR p.used) AND p.hook <> 'lmcache.mp_server'
      AND (p.source_key IS NULL OR p.backend = 'vllm.LMCacheMPConnector')
),
classes AS (
    SELECT trace_id, span_id, attributes[getvariable('kvaudit_class_attr')] AS request_class
    FROM spans
    WHERE op = 'fetch' AND getvariable('kvaudit_class_attr') IS NOT NULL
),
matrix AS (
    SELECT coalesce(c.request_class, 'all') AS request_class, f.producer, f.consumer,
           count(*) AS pages, sum(f.tokens) AS tokens, sum(f.bytes) AS bytes
    FROM fetched f
    -- The variable's test again here, not only in `classes`: with no class attribute set, the
    -- planner then drops the join, and with it reading every fetched page's span ids.
    LEFT JOIN classes c
           ON getvariable('kvaudit_class_attr') IS NOT NULL AND c.trace_id = f.trace_id AND c.span_id = f.span_id
    GROUP BY coalesce(c.request_class, 'all'), f.producer, f.consumer
)
SELECT request_class, producer, consumer, pages, tokens, bytes,
       coalesce(producer <> consumer, false) AS crossed,
       tokens / nullif(sum(tokens) OVER (PARTITION BY request_class), 0) AS token_share
FROM matrix
ORDER BY request_class, producer NULLS LAST, consumer;
