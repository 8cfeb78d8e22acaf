-- capacity_curve: the page reference stream that the pool-capacity curve is computed from.
--
-- Question: at which pool size does reuse stop paying? The curve (hit rate as a function
--           of pool bytes) comes from LRU stack distances over this stream: every store
--           and fetch of a page is one access to its key, in time order; an access hits
--           a pool of C bytes when the distinct pages touched since the previous access
--           of the same key, itself included, hold at most C bytes. Stack distances need
--           a sequential pass that SQL cannot express efficiently, so this query yields
--           the stream and kvaudit.capacity computes the curve (`kvaudit report`).
--           SHARDS spatial sampling (Waldspurger et al., FAST '15) happens here: a key is
--           kept when its hash falls under the sampling rate, so a kept key keeps all its
--           accesses and distances scale by 1 / rate. The hash is MD5's upper half,
--           which DuckDB and ClickHouse compute alike (queries/README.md), so both
--           engines sample the same keys.
-- Parameters: kvaudit_sample_rate (DOUBLE, default 1.0: exact): share of keys kept.
-- Columns: key_hash (UBIGINT), bytes (the page's bytes, 0 when absent), in access order.
SELECT md5_number_upper(key) AS key_hash, coalesce(bytes, 0) AS bytes
FROM pages
WHERE op IN ('store', 'fetch') AND key IS NOT NULL
  AND md5_number_upper(key) % 1000000 < coalesce(getvariable('kvaudit_sample_rate'), 1.0) * 1000000
ORDER BY time_ns, file, line;
