-- tui/reuse: fetched pages by producer and consumer over a time window (the TUI's reuse matrix).
--
-- Question: whose pages did each replica fetch, how many did it use, and how many did it reject?
-- Parameters: kvaudit_since_ns (window start, Unix ns; 0 for everything; the window starts at the
--             whole second). Reads `tui_reuse_ledger`, kept by `tui/ingest` (stores are
--             looked up over the whole trace, not only the window: a page fetched now may
--             have been stored long before).
-- Columns: producer (replica of the earliest store of the key that precedes the fetch
--          by at most the skew; NULL when no store was seen), consumer, pages,
--          used_pages, rejected_pages (used = false: safe misses), used_tokens
--          (token range of used pages), used_bytes.
SELECT producer,
       consumer,
       sum(pages)::BIGINT AS pages,
       sum(used_pages)::BIGINT AS used_pages,
       sum(rejected_pages)::BIGINT AS rejected_pages,
       sum(used_tokens)::BIGINT AS used_tokens,
       sum(used_bytes)::BIGINT AS used_bytes
FROM tui_reuse_ledger
WHERE second >= getvariable('kvaudit_since_ns') // 1_000_000_000
GROUP BY ALL
HAVING sum(pages) > 0
ORDER BY producer NULLS LAST, consumer;
