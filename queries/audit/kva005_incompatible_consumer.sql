-- KVA005 incompatible-consumer: the page, as fetched or as its producer stored it, does not
-- fit the consuming replica's own KV configuration.
--
-- What it catches: model, dtype, layout, world size, rank, hash algorithm or head
--   geometry (layers, kv_heads, head_size) of the fetched descriptor, or of the
--   producer's stored descriptor, differing from the consumer process's resource
--   (the `replicas` row of the process that fetched). Only fields present on both
--   sides of a comparison count; an absent field is KVA001's.
-- Why it matters: this is the rolling-upgrade failure of docs/design.md section 1: the
--   bytes count matches, the key matches, and the consumer reads a page laid out for
--   another engine (LMCache #4463, #4247). Comparing the producer's descriptor too
--   catches it when the fetched object did not carry its layout.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON object field ->
--   {"fetched": ..., "stored": ..., "consumer": ...}, null for the fields that fit.
WITH compared AS (
    SELECT *,
           coalesce(model <> c_model, false) OR coalesce(s_model <> c_model, false) AS d_model,
           coalesce(dtype <> c_dtype, false) OR coalesce(s_dtype <> c_dtype, false) AS d_dtype,
           coalesce(layout <> c_layout, false) OR coalesce(s_layout <> c_layout, false) AS d_layout,
           coalesce(world_size <> c_world_size, false) OR coalesce(s_world_size <> c_world_size, false)
               AS d_world_size,
           coalesce(rank <> c_rank, false) OR coalesce(s_rank <> c_rank, false) AS d_rank,
           coalesce(hash_algo <> c_hash_algo, false) OR coalesce(s_hash_algo <> c_hash_algo, false) AS d_hash_algo,
           coalesce(layers <> c_layers, false) OR coalesce(s_layers <> c_layers, false) AS d_layers,
           coalesce(kv_heads <> c_kv_heads, false) OR coalesce(s_kv_heads <> c_kv_heads, false) AS d_kv_heads,
           coalesce(head_size <> c_head_size, false) OR coalesce(s_head_size <> c_head_size, false) AS d_head_size
    FROM audit_fetches
)
SELECT 'KVA005' AS code,
       'incompatible-consumer' AS rule,
       json_object(
           'model', CASE WHEN d_model THEN json_object('fetched', model, 'stored', s_model, 'consumer', c_model) END,
           'dtype', CASE WHEN d_dtype THEN json_object('fetched', dtype, 'stored', s_dtype, 'consumer', c_dtype) END,
           'layout', CASE WHEN d_layout
                          THEN json_object('fetched', layout, 'stored', s_layout, 'consumer', c_layout) END,
           'world_size', CASE WHEN d_world_size
                              THEN json_object('fetched', world_size, 'stored', s_world_size,
                                               'consumer', c_world_size) END,
           'rank', CASE WHEN d_rank THEN json_object('fetched', rank, 'stored', s_rank, 'consumer', c_rank) END,
           'hash_algo', CASE WHEN d_hash_algo
                             THEN json_object('fetched', hash_algo, 'stored', s_hash_algo,
                                              'consumer', c_hash_algo) END,
           'layers', CASE WHEN d_layers
                          THEN json_object('fetched', layers, 'stored', s_layers, 'consumer', c_layers) END,
           'kv_heads', CASE WHEN d_kv_heads
                            THEN json_object('fetched', kv_heads, 'stored', s_kv_heads, 'consumer', c_kv_heads) END,
           'head_size', CASE WHEN d_head_size
                             THEN json_object('fetched', head_size, 'stored', s_head_size,
                                              'consumer', c_head_size) END
       ) AS fields,
       'page does not fit the configuration of ' || replica || ' in '
           || concat_ws(', ',
                  CASE WHEN d_model THEN 'model' END, CASE WHEN d_dtype THEN 'dtype' END,
                  CASE WHEN d_layout THEN 'layout' END, CASE WHEN d_world_size THEN 'world_size' END,
                  CASE WHEN d_rank THEN 'rank' END, CASE WHEN d_hash_algo THEN 'hash_algo' END,
                  CASE WHEN d_layers THEN 'layers' END, CASE WHEN d_kv_heads THEN 'kv_heads' END,
                  CASE WHEN d_head_size THEN 'head_size' END) AS message,
       *
FROM compared
WHERE d_model OR d_dtype OR d_layout OR d_world_size OR d_rank OR d_hash_algo
   OR d_layers OR d_kv_heads OR d_head_size;
