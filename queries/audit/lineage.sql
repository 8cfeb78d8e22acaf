-- lineage: every fetched page beside its producer's stored descriptor and its consumer's configuration.
--
-- What it is: the shared base of the audit rules: queries/audit/kva*.sql read it as
--   `audit_fetches`, which the auditor (kvaudit.analyse.audit) defines as a CTE over this query,
--   in one statement with all the rules. It joins each fetched page to the
--   *producer* store of its key (`audit_producers`, queries/audit/producers.sql: the
--   earliest store of that key anywhere), when that store precedes the fetch (allowing
--   `kvaudit_skew_s` of clock skew between machines); and to the `replicas` row of the
--   process that fetched it (the consumer's own KV configuration).
-- Layers: a fetched page that names the page of the layer below that served it
--   (`source_key`: a vLLM block loaded through LMCache names its chunk) is judged by the
--   most complete description either layer recorded: each descriptor field it lacks
--   (model, dtype, shape, layout, bytes, world_size, rank, layers, kv_heads, head_size,
--   checksum, transfer, address) comes from that page, the fetch of that key in the same
--   trace (the layer below's span is a child of the fetch's). Key, hash algorithm, token
--   range, `used` and the geometry fingerprint stay the page's own. Without such a page, the fields stay absent
--   (docs/design.md section 4.2).
-- Why it matters: which replica produced a fetched page is not in the page; this join
--   is how the auditor knows what was stored under the key and by whom.
-- Reads: pages, replicas, audit_producers (queries/audit/producers.sql, which the auditor
--   puts before this query).
-- Parameters: kvaudit_skew_s (DOUBLE, default 1.0): allowed clock skew in seconds.
-- Columns: the fetched page's file, line, resource_id, replica, trace_id, span_id and
--   descriptor fields (key ... address, not tier; geometry); severity ('warning' when the
--   page was rejected, used = false; otherwise 'critical': a page not shown to be a
--   safe miss is treated as used); key_stored (a store of the key exists anywhere);
--   producer, producer_resource_id and s_<field> (the producer's stored
--   descriptor; NULL without a producer); c_<field> (the consumer's configuration).
WITH below AS (
    -- Fetches of a layer below that a fetch above names, one per trace and key.
    SELECT trace_id, key, model, dtype, shape, layout, bytes, world_size, rank, layers, kv_heads, head_size,
           checksum, transfer, address
    FROM (
        SELECT *, row_number() OVER (PARTITION BY trace_id, key ORDER BY time_ns, file, line) AS nth
        FROM pages
        WHERE op = 'fetch'
          AND key IN (SELECT source_key FROM pages WHERE op = 'fetch' AND source_key IS NOT NULL)
    ) named
    WHERE nth = 1
),
fetched AS (
    SELECT p.file, p.line, p.resource_id, p.replica, p.trace_id, p.span_id, p.time_ns, p.key, p.hash_algo,
           p.token_start, p.token_end, coalesce(p.model, b.model) AS model, coalesce(p.dtype, b.dtype) AS dtype,
           coalesce(p.shape, b.shape) AS shape, coalesce(p.layout, b.layout) AS layout,
           coalesce(p.bytes, b.bytes) AS bytes, coalesce(p.world_size, b.world_size) AS world_size,
           coalesce(p.rank, b.rank) AS rank, coalesce(p.layers, b.layers) AS layers,
           coalesce(p.kv_heads, b.kv_heads) AS kv_heads, coalesce(p.head_size, b.head_size) AS head_size,
           p.used, coalesce(p.checksum, b.checksum) AS checksum, coalesce(p.transfer, b.transfer) AS transfer,
           coalesce(p.address, b.address) AS address, p.geometry
    FROM pages p
    LEFT JOIN below b ON b.trace_id = p.trace_id AND b.key = p.source_key
    WHERE p.op = 'fetch'
),
joined AS (
    -- One join serves both key_stored and the producer: the earliest store of the key is
    -- the producer exactly when it precedes the fetch (no later store can precede it).
    SELECT f.file, f.line, f.resource_id, f.replica, f.trace_id, f.span_id, f.key, f.hash_algo, f.token_start,
           f.token_end, f.model, f.dtype, f.shape, f.layout, f.bytes, f.world_size, f.rank, f.layers,
           f.kv_heads, f.head_size, f.used, f.checksum, f.transfer, f.address, f.geometry,
           s.key IS NOT NULL AS key_stored,
           s.time_ns <= f.time_ns + CAST(coalesce(getvariable('kvaudit_skew_s'), 1.0) * 1e9 AS BIGINT) AS produced,
           s.replica AS p_replica, s.resource_id AS p_resource_id, s.model AS p_model, s.dtype AS p_dtype,
           s.shape AS p_shape, s.layout AS p_layout, s.bytes AS p_bytes, s.token_start AS p_token_start,
           s.token_end AS p_token_end, s.world_size AS p_world_size, s.rank AS p_rank, s.checksum AS p_checksum,
           s.hash_algo AS p_hash_algo, s.layers AS p_layers, s.kv_heads AS p_kv_heads, s.head_size AS p_head_size,
           s.geometry AS p_geometry,
           c.model AS c_model, c.dtype AS c_dtype, c.layout AS c_layout, c.world_size AS c_world_size,
           c.rank AS c_rank, c.hash_algo AS c_hash_algo, c.layers AS c_layers, c.kv_heads AS c_kv_heads,
           c.head_size AS c_head_size, c.geometry AS c_geometry
    FROM fetched f
    LEFT JOIN audit_producers s ON s.key = f.key
    LEFT JOIN replicas c ON c.resource_id = f.resource_id
)
SELECT file, line, resource_id, replica, trace_id, span_id, key, hash_algo, token_start, token_end, model, dtype,
       shape, layout, bytes, world_size, rank, layers, kv_heads, head_size, used, checksum, transfer, address,
       geometry,
       CASE WHEN used = false THEN 'warning' ELSE 'critical' END AS severity,
       key_stored,
       CASE WHEN produced THEN p_replica END AS producer,
       CASE WHEN produced THEN p_resource_id END AS producer_resource_id,
       CASE WHEN produced THEN p_model END AS s_model,
       CASE WHEN produced THEN p_dtype END AS s_dtype,
       CASE WHEN produced THEN p_shape END AS s_shape,
       CASE WHEN produced THEN p_layout END AS s_layout,
       CASE WHEN produced THEN p_bytes END AS s_bytes,
       CASE WHEN produced THEN p_token_start END AS s_token_start,
       CASE WHEN produced THEN p_token_end END AS s_token_end,
       CASE WHEN produced THEN p_world_size END AS s_world_size,
       CASE WHEN produced THEN p_rank END AS s_rank,
       CASE WHEN produced THEN p_checksum END AS s_checksum,
       CASE WHEN produced THEN p_hash_algo END AS s_hash_algo,
       CASE WHEN produced THEN p_layers END AS s_layers,
       CASE WHEN produced THEN p_kv_heads END AS s_kv_heads,
       CASE WHEN produced THEN p_head_size END AS s_head_size,
       CASE WHEN produced THEN p_geometry END AS s_geometry,
       c_model, c_dtype, c_layout, c_world_size, c_rank, c_hash_algo, c_layers, c_kv_heads, c_head_size, c_geometry
FROM joined;
