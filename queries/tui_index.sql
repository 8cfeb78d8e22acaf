-- tui_index: the temporary tables of the TUI's producer index (filled by `tui_ingest`).
--
-- Columns: `tui_first_store`: key, producer, stored_ns (the earliest store of each key);
--          `tui_fetches`: key, consumer, time_ns, used, tokens, bytes, producer (one row per
--          fetched page; producer NULL when no store of its key precedes it within the skew).
-- No primary key: maintaining its index costs more than the scans it would save here.
CREATE TEMP TABLE IF NOT EXISTS tui_first_store (key VARCHAR, producer VARCHAR, stored_ns BIGINT);
CREATE TEMP TABLE IF NOT EXISTS tui_fetches (
    key VARCHAR, consumer VARCHAR, time_ns BIGINT, used BOOLEAN, tokens BIGINT, bytes BIGINT, producer VARCHAR
);
