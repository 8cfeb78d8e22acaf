-- producers: the producer store of every stored key: the earliest store of that key anywhere.
--
-- What it is: the stored side of the audit's lineage (queries/audit/lineage.sql reads it
--   as `audit_producers`). The auditor (kvaudit.audit) computes it once per audit, as a
--   materialised CTE, and every rule reads it through the lineage: one pass over the
--   stores instead of one per rule. Ties in time go to the earlier file and line, so
--   the producer does not depend on the engine's row order.
-- Why it matters: which replica produced a fetched page is not in the page; the
--   earliest store of its key is, when that store precedes the fetch (the lineage
--   checks the time against each fetch).
-- Parameters: none.
-- Columns: key, time_ns, replica, resource_id and the stored descriptor fields (model,
--   dtype, shape, layout, bytes, token_start, token_end, world_size, rank, checksum,
--   hash_algo, layers, kv_heads, head_size): one row per stored key.
SELECT key, time_ns, replica, resource_id, model, dtype, shape, layout, bytes, token_start, token_end,
       world_size, rank, checksum, hash_algo, layers, kv_heads, head_size
FROM (
    SELECT key, time_ns, replica, resource_id, model, dtype, shape, layout, bytes, token_start, token_end,
           world_size, rank, checksum, hash_algo, layers, kv_heads, head_size,
           row_number() OVER (PARTITION BY key ORDER BY time_ns, file, line) AS nth
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
) stores
WHERE nth = 1;
