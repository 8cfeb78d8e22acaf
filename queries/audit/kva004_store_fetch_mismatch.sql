-- KVA004 store-fetch-mismatch: a fetched page disagrees with what its producer stored under the same key.
--
-- What it catches: a fetched descriptor whose model, dtype, shape, layout, bytes, token
--   range, world size, rank or checksum differs from the producer store's descriptor
--   (the earliest store of the key before the fetch, queries/audit/lineage.sql). Only
--   fields present on both sides are compared; an absent field is KVA001's.
-- Why it matters: the key says "same content", the descriptors say otherwise: the pool
--   served something other than what was put there (a failed store left visible,
--   LMCache #4991; a payload rewritten under the key; a hook describing it wrongly).
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON object field ->
--   {"fetched": ..., "stored": ...}, null for the fields that agree.
WITH compared AS (
    -- `<>` is NULL when either side is absent: such a field is not a difference here.
    SELECT *,
           coalesce(model <> s_model, false) AS d_model,
           coalesce(dtype <> s_dtype, false) AS d_dtype,
           coalesce(shape <> s_shape, false) AS d_shape,
           coalesce(layout <> s_layout, false) AS d_layout,
           coalesce(bytes <> s_bytes, false) AS d_bytes,
           coalesce(token_start <> s_token_start, false) AS d_token_start,
           coalesce(token_end <> s_token_end, false) AS d_token_end,
           coalesce(world_size <> s_world_size, false) AS d_world_size,
           coalesce(rank <> s_rank, false) AS d_rank,
           coalesce(checksum <> s_checksum, false) AS d_checksum
    FROM audit_fetches
    WHERE producer IS NOT NULL
)
SELECT 'KVA004' AS code,
       'store-fetch-mismatch' AS rule,
       json_object(
           'model', CASE WHEN d_model THEN json_object('fetched', model, 'stored', s_model) END,
           'dtype', CASE WHEN d_dtype THEN json_object('fetched', dtype, 'stored', s_dtype) END,
           'shape', CASE WHEN d_shape THEN json_object('fetched', shape, 'stored', s_shape) END,
           'layout', CASE WHEN d_layout THEN json_object('fetched', layout, 'stored', s_layout) END,
           'bytes', CASE WHEN d_bytes THEN json_object('fetched', bytes, 'stored', s_bytes) END,
           'token_start', CASE WHEN d_token_start THEN json_object('fetched', token_start, 'stored', s_token_start) END,
           'token_end', CASE WHEN d_token_end THEN json_object('fetched', token_end, 'stored', s_token_end) END,
           'world_size', CASE WHEN d_world_size THEN json_object('fetched', world_size, 'stored', s_world_size) END,
           'rank', CASE WHEN d_rank THEN json_object('fetched', rank, 'stored', s_rank) END,
           'checksum', CASE WHEN d_checksum THEN json_object('fetched', checksum, 'stored', s_checksum) END
       ) AS fields,
       'fetched page differs from what ' || producer || ' stored under its key in '
           || concat_ws(', ',
                  CASE WHEN d_model THEN 'model' END, CASE WHEN d_dtype THEN 'dtype' END,
                  CASE WHEN d_shape THEN 'shape' END, CASE WHEN d_layout THEN 'layout' END,
                  CASE WHEN d_bytes THEN 'bytes' END, CASE WHEN d_token_start THEN 'token_start' END,
                  CASE WHEN d_token_end THEN 'token_end' END, CASE WHEN d_world_size THEN 'world_size' END,
                  CASE WHEN d_rank THEN 'rank' END, CASE WHEN d_checksum THEN 'checksum' END) AS message,
       *
FROM compared
WHERE d_model OR d_dtype OR d_shape OR d_layout OR d_bytes OR d_token_start OR d_token_end
   OR d_world_size OR d_rank OR d_checksum;
