-- lineage: every fetched page beside its producer's stored descriptor and its consumer's configuration.
--
-- What it is: the shared base of the audit rules: queries/audit/kva*.sql read it as
--   `audit_fetches`, which the auditor (kvaudit.audit) defines as a CTE over this query,
--   in one statement with all the rules. It joins each fetched page to the
--   *producer* store of its key: the earliest store of that key anywhere, when that
--   store precedes the fetch (allowing `kvaudit_skew_s` of clock skew between
--   machines); and to the `replicas` row of the process that fetched it (the
--   consumer's own KV configuration).
-- Why it matters: which replica produced a fetched page is not in the page; this join
--   is how the auditor knows what was stored under the key and by whom.
-- Parameters: kvaudit_skew_s (DOUBLE, default 1.0): allowed clock skew in seconds.
-- Columns: the fetched page's file, line, resource_id, replica, trace_id, span_id and
--   descriptor fields (key ... address, not tier); severity ('warning' when the
--   page was rejected, used = false; otherwise 'critical': a page not shown to be a
--   safe miss is treated as used); key_stored (a store of the key exists anywhere);
--   producer, producer_resource_id and s_<field> (the producer's stored
--   descriptor; NULL without a producer); c_<field> (the consumer's configuration).
WITH stores AS (
    SELECT key, replica, resource_id, time_ns, model, dtype, shape, layout, bytes, token_start, token_end,
           world_size, rank, checksum, hash_algo, layers, kv_heads, head_size,
           row_number() OVER (PARTITION BY key ORDER BY time_ns, file, line) AS nth
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
),
first_store AS (
    SELECT * FROM stores WHERE nth = 1
)
SELECT f.file, f.line, f.resource_id, f.replica, f.trace_id, f.span_id, f.key, f.hash_algo, f.token_start,
       f.token_end, f.model, f.dtype, f.shape, f.layout, f.bytes, f.world_size, f.rank, f.layers, f.kv_heads,
       f.head_size, f.used, f.checksum, f.transfer, f.address,
       CASE WHEN f.used = false THEN 'warning' ELSE 'critical' END AS severity,
       s.key IS NOT NULL AS key_stored,
       p.replica AS producer,
       p.resource_id AS producer_resource_id,
       p.model AS s_model, p.dtype AS s_dtype, p.shape AS s_shape, p.layout AS s_layout, p.bytes AS s_bytes,
       p.token_start AS s_token_start, p.token_end AS s_token_end, p.world_size AS s_world_size,
       p.rank AS s_rank, p.checksum AS s_checksum, p.hash_algo AS s_hash_algo, p.layers AS s_layers,
       p.kv_heads AS s_kv_heads, p.head_size AS s_head_size,
       c.model AS c_model, c.dtype AS c_dtype, c.layout AS c_layout, c.world_size AS c_world_size,
       c.rank AS c_rank, c.hash_algo AS c_hash_algo, c.layers AS c_layers, c.kv_heads AS c_kv_heads,
       c.head_size AS c_head_size
FROM pages f
LEFT JOIN first_store s ON s.key = f.key
LEFT JOIN first_store p
       ON p.key = f.key
      AND p.time_ns <= f.time_ns + CAST(coalesce(getvariable('kvaudit_skew_s'), 1.0) * 1e9 AS BIGINT)
LEFT JOIN replicas c ON c.resource_id = f.resource_id
WHERE f.op = 'fetch'
