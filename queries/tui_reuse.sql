-- tui_reuse: fetched pages by producer and consumer over a time window (the TUI's reuse matrix).
--
-- Question: whose pages did each replica fetch, how many did it use, and how many did it reject?
-- Parameters: $since_ns (window start, Unix ns; 0 for everything). Reads `tui_fetches`,
--             kept by `tui_ingest` (stores are looked up over the whole trace, not only
--             the window: a page fetched now may have been stored long before).
-- Columns: producer (replica of the earliest store of the key that precedes the fetch
--          by at most the skew; NULL when no store was seen), consumer, pages,
--          used_pages, rejected_pages (used = false: safe misses), used_tokens
--          (token range of used pages), used_bytes.
SELECT producer,
       consumer,
       count(*) AS pages,
       count(*) FILTER (WHERE used) AS used_pages,
       count(*) FILTER (WHERE NOT used) AS rejected_pages,
       coalesce(sum(tokens) FILTER (WHERE used), 0) AS used_tokens,
       coalesce(sum(bytes) FILTER (WHERE used), 0) AS used_bytes
FROM tui_fetches
WHERE time_ns >= $since_ns
GROUP BY ALL
ORDER BY producer NULLS LAST, consumer;
