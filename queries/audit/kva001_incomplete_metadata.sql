-- KVA001 incomplete-metadata: a fetched page lacks a field the contract requires on a fetch.
--
-- What it catches: descriptors of fetched pages without key, hash_algo, token range,
--   model, dtype, shape, layout, bytes, world_size, rank or used (docs/design.md section 3).
-- Why it matters: a hook records what the fetched object actually carried; a missing
--   field means the object could not prove it fits the consumer (LMCache does not keep
--   the KV layout with a chunk), so a mismatch there would go unseen. Rules KVA004 and
--   KVA005 compare only fields present on both sides: absence is this rule's alone.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON array of the missing names.
WITH checked AS (
    SELECT *,
           concat_ws(', ',
               CASE WHEN key IS NULL THEN 'key' END,
               CASE WHEN hash_algo IS NULL THEN 'hash_algo' END,
               CASE WHEN token_start IS NULL THEN 'token_start' END,
               CASE WHEN token_end IS NULL THEN 'token_end' END,
               CASE WHEN model IS NULL THEN 'model' END,
               CASE WHEN dtype IS NULL THEN 'dtype' END,
               CASE WHEN shape IS NULL THEN 'shape' END,
               CASE WHEN layout IS NULL THEN 'layout' END,
               CASE WHEN bytes IS NULL THEN 'bytes' END,
               CASE WHEN world_size IS NULL THEN 'world_size' END,
               CASE WHEN rank IS NULL THEN 'rank' END,
               CASE WHEN used IS NULL THEN 'used' END) AS missing
    FROM audit_fetches
)
SELECT 'KVA001' AS code,
       'incomplete-metadata' AS rule,
       '["' || replace(missing, ', ', '","') || '"]' AS fields,
       'fetched page lacks ' || missing AS message,
       *
FROM checked
WHERE missing <> '';
