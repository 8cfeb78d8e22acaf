-- KVA006 orphan-fetch: a fetched key has no store anywhere in the traces.
--
-- What it catches: fetched pages whose key no store span of any replica recorded.
-- Why it matters: either the store happened outside the trace window or in a process
--   that is not traced (severity info: it may be an artefact of the window), or the
--   pool served a key nobody put there. Either way the fetched page's producer, and so
--   rules KVA002, KVA004 and the stored side of KVA005, could not be checked.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is an empty JSON object.
SELECT 'KVA006' AS code,
       'orphan-fetch' AS rule,
       'info' AS severity,
       '{}' AS fields,
       'fetched key was never stored in these traces' AS message,
       * EXCLUDE (severity)
FROM audit_fetches
WHERE key IS NOT NULL AND NOT key_stored;
