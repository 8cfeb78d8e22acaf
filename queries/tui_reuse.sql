-- tui_reuse: fetched pages by producer and consumer over a time window (the TUI's reuse matrix).
--
-- Question: whose pages did each replica fetch, how many did it use, and how many did it reject?
-- Parameters: $since_ns (window start, Unix ns; 0 for everything),
--             $skew_ns (clock skew allowed between replicas, ns).
-- Columns: producer (replica of the earliest store of the key that precedes the fetch
--          by at most the skew; NULL when no store was seen), consumer, pages,
--          used_pages, rejected_pages (used = false: safe misses), used_tokens
--          (token range of used pages), used_bytes.
-- Stores are looked up over the whole trace, not only the window: a page fetched now
-- may have been stored long before.
WITH first_store AS (
    SELECT key, arg_min(replica, time_ns) AS producer, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
)
SELECT f.producer,
       p.replica AS consumer,
       count(*) AS pages,
       count(*) FILTER (WHERE p.used) AS used_pages,
       count(*) FILTER (WHERE NOT p.used) AS rejected_pages,
       coalesce(sum(p.token_end - p.token_start) FILTER (WHERE p.used), 0) AS used_tokens,
       coalesce(sum(p.bytes) FILTER (WHERE p.used), 0) AS used_bytes
FROM pages p
LEFT JOIN first_store f ON f.key = p.key AND f.stored_ns <= p.time_ns + $skew_ns
WHERE p.op = 'fetch' AND p.time_ns >= $since_ns
GROUP BY ALL
ORDER BY producer NULLS LAST, consumer;
