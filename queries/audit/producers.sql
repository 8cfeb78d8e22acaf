-- producers: the producer store of every stored key: the earliest store of that key anywhere.
--
-- What it is: the stored side of the audit's lineage (queries/audit/lineage.sql reads it
--   as `audit_producers`). The auditor (kvaudit.analyse.audit) computes it once per audit, as a
--   materialised CTE, and every rule reads it through the lineage: one pass over the
--   stores instead of one per rule. Ties in time go to the earlier file and line, so
--   the producer does not depend on the engine's row order.
-- Layers: a stored page that names the page of the layer below holding its tokens
--   (`source_key`: a vLLM block stored through LMCache names its chunk) is described by
--   both: each descriptor field it lacks comes from that page, the store of that key in
--   the same trace (docs/design.md section 4.2). Its geometry fingerprint stays its own:
--   each layer's fingerprint is comparable only with the processes of that layer.
-- Why it matters: which replica produced a fetched page is not in the page; the
--   earliest store of its key is, when that store precedes the fetch (the lineage
--   checks the time against each fetch).
-- Parameters: none.
-- Columns: key, time_ns, replica, resource_id and the stored descriptor fields (model,
--   dtype, shape, layout, bytes, token_start, token_end, world_size, rank, checksum,
--   hash_algo, layers, kv_heads, head_size, geometry): one row per stored key.
WITH below AS (
    -- Stores of a layer below that a store above names, one per trace and key.
    SELECT trace_id, key, model, dtype, shape, layout, bytes, world_size, rank, checksum, layers, kv_heads,
           head_size
    FROM (
        SELECT *, row_number() OVER (PARTITION BY trace_id, key ORDER BY time_ns, file, line) AS nth
        FROM pages
        WHERE op = 'store'
          AND key IN (SELECT source_key FROM pages WHERE op = 'store' AND source_key IS NOT NULL)
    ) named
    WHERE nth = 1
),
stores AS (
    SELECT s.key, s.time_ns, s.replica, s.resource_id,
           coalesce(s.model, b.model) AS model, coalesce(s.dtype, b.dtype) AS dtype,
           coalesce(s.shape, b.shape) AS shape, coalesce(s.layout, b.layout) AS layout,
           coalesce(s.bytes, b.bytes) AS bytes, s.token_start, s.token_end,
           coalesce(s.world_size, b.world_size) AS world_size, coalesce(s.rank, b.rank) AS rank,
           coalesce(s.checksum, b.checksum) AS checksum, s.hash_algo,
           coalesce(s.layers, b.layers) AS layers, coalesce(s.kv_heads, b.kv_heads) AS kv_heads,
           coalesce(s.head_size, b.head_size) AS head_size, s.geometry,
           row_number() OVER (PARTITION BY s.key ORDER BY s.time_ns, s.file, s.line) AS nth
    FROM pages s
    LEFT JOIN below b ON b.trace_id = s.trace_id AND b.key = s.source_key
    WHERE s.op = 'store' AND s.key IS NOT NULL
)
SELECT key, time_ns, replica, resource_id, model, dtype, shape, layout, bytes, token_start, token_end,
       world_size, rank, checksum, hash_algo, layers, kv_heads, head_size, geometry
FROM stores
WHERE nth = 1;
