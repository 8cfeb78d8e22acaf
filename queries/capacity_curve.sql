-- capacity_curve: the page reference stream that the pool-capacity curve is computed from.
--
-- Question: at which pool size does reuse stop paying? The curve (hit rate as a function
--           of pool bytes) comes from LRU stack distances over this stream: every store
--           and fetch of a page is one access to its key, in time order; an access hits
--           a pool of C bytes when the distinct pages touched since the previous access
--           of the same key, itself included, hold at most C bytes. Stack distances need
--           a sequential pass that SQL cannot express efficiently, so this query yields
--           the stream and kvaudit.analyse.capacity computes the curve (`kvaudit report`).
--           SHARDS spatial sampling (Waldspurger et al., FAST '15) happens here: a key is
--           kept when its hash falls under the sampling rate, so a kept key keeps all its
--           accesses and distances scale by 1 / rate. The hash is MD5's upper half,
--           which DuckDB and ClickHouse compute alike (queries/README.md), so both
--           engines sample the same keys.
--           Reuse is skewed (a few hot prefixes take most of it), and whether a 1% sample
--           happens to hold the hottest keys swings the whole curve. So the hottest keys
--           (up to 1,000, together at most ten times the sample's share of the accesses)
--           are kept exactly, with all their accesses at weight 1; the others are sampled.
--           This takes that luck out of the curve's error at a given rate.
-- Parameters: kvaudit_sample_rate (DOUBLE, default 1.0: exact): share of the other keys kept.
-- Columns: key_hash (UBIGINT), bytes (the page's bytes, 0 when absent), exact (BOOLEAN: a
--          hot key kept whatever the rate), in access order.
WITH accesses AS (
    SELECT key, bytes, time_ns, file, line
    FROM pages
    WHERE op IN ('store', 'fetch') AND key IS NOT NULL
),
counts AS (
    SELECT key, count(*) AS n FROM accesses GROUP BY key
),
hottest AS (
    SELECT key, n FROM counts ORDER BY n DESC, key LIMIT 1000
),
exact_keys AS (
    SELECT key
    FROM (SELECT key, sum(n) OVER (ORDER BY n DESC, key ROWS UNBOUNDED PRECEDING) AS running FROM hottest) AS ranked
    WHERE running <= 10 * coalesce(getvariable('kvaudit_sample_rate'), 1.0) * (SELECT sum(n) FROM counts)
)
SELECT md5_number_upper(key) AS key_hash, coalesce(bytes, 0) AS bytes, key IN (SELECT key FROM exact_keys) AS exact
FROM accesses
WHERE key IN (SELECT key FROM exact_keys)
   OR md5_number_upper(key) % 1000000 < coalesce(getvariable('kvaudit_sample_rate'), 1.0) * 1000000
ORDER BY time_ns, file, line;
