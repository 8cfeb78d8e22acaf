-- KVA002 process-local-reference: a fetched page points at its payload by a process-local
-- address, and another process produced it.
--
-- What it catches: fetched pages with `address` present or `transfer` = 'raw_ptr' whose
--   producer store (queries/audit/lineage.sql) ran in another process (resource_id),
--   whether of another replica or of the same one. A page the consumer's own process
--   stored is fine. Without a producer in the traces the rule cannot tell, and says so
--   at severity info (the store may lie outside the trace window).
-- Why it matters: an address means nothing outside the process that took it; reading
--   through it in another process reads whatever lives there now.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON object field ->
--   {"fetched": ..., "stored": ..., "consumer": ...}.
SELECT 'KVA002' AS code,
       'process-local-reference' AS rule,
       CASE WHEN producer IS NULL THEN 'info' ELSE severity END AS severity,
       json_object(
           'address', json_object('fetched', address),
           'transfer', json_object('fetched', transfer),
           'replica', json_object('stored', producer, 'consumer', replica),
           'process', json_object('stored', CAST(producer_resource_id AS VARCHAR),
                                  'consumer', CAST(resource_id AS VARCHAR))) AS fields,
       CASE WHEN producer IS NULL
            THEN 'fetched page refers to a process-local address and its producer is not in the traces'
            WHEN producer = replica
            THEN 'fetched page refers to an address local to another process of replica ' || producer
            ELSE 'fetched page refers to an address local to replica ' || producer
       END AS message,
       * EXCLUDE (severity)
FROM audit_fetches
WHERE (address IS NOT NULL OR transfer = 'raw_ptr')
  AND (producer_resource_id IS NULL OR producer_resource_id <> resource_id);
