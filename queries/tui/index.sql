-- tui/index: the temporary tables of the TUI's producer index (filled by `tui/ingest`).
--
-- Columns: `tui_first_store`: key, producer, stored_ns (the earliest store of each key);
--          `tui_fetches`: key, consumer, time_ns, used, tokens, bytes, producer (one row per
--          fetched page; producer NULL when no store of its key precedes it within the skew);
--          `tui_reuse_ledger`: producer, consumer, second (Unix seconds of the fetch),
--          pages, used_pages, rejected_pages, used_tokens, used_bytes: counts of fetched
--          pages, appended as signed deltas (a fetch whose producer changes is taken away
--          from its old producer and added to its new one), so sums over seconds are
--          the reuse figures of any window without visiting every page.
-- No primary keys: maintaining their indexes costs more than the scans they would save here.
CREATE TEMP TABLE IF NOT EXISTS tui_first_store (key VARCHAR, producer VARCHAR, stored_ns BIGINT);
CREATE TEMP TABLE IF NOT EXISTS tui_fetches (
    key VARCHAR, consumer VARCHAR, time_ns BIGINT, used BOOLEAN, tokens BIGINT, bytes BIGINT, producer VARCHAR
);
CREATE TEMP TABLE IF NOT EXISTS tui_reuse_ledger (
    producer VARCHAR, consumer VARCHAR, second BIGINT, pages BIGINT, used_pages BIGINT, rejected_pages BIGINT,
    used_tokens BIGINT, used_bytes BIGINT
);
