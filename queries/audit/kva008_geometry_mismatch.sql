-- KVA008 geometry-mismatch: the page was computed by a replica of another geometry
-- fingerprint than the consuming replica's.
--
-- What it catches: a fetched page whose geometry fingerprint (`geometry`, docs/design.md
--   section 4.5), as the fetched descriptor carries it or as its producer's stored
--   descriptor does, differs from the consumer process's (`replicas.geometry`). Pages
--   and processes without a fingerprint (producers from before it) are not compared.
-- Why it matters: the fingerprint names everything that makes a page readable (model,
--   dtype, layout, layers, KV heads, head size, block size, TP world size and rank, the
--   engine's KV format version). With `prevent` on everywhere such a page is never
--   found, since the fingerprint is part of its key: a finding here is a pool whose
--   replicas do not all prevent, or do not prevent at all, serving a page that cannot
--   fit. It covers what KVA005 cannot compare (block size, format version, a field a
--   descriptor left out) and names the cause in one field.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules).
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON object
--   {"geometry": {"fetched": ..., "stored": ..., "consumer": ...}}.
SELECT 'KVA008' AS code,
       'geometry-mismatch' AS rule,
       json_object('geometry', json_object('fetched', geometry, 'stored', s_geometry, 'consumer', c_geometry))
           AS fields,
       'page of geometry '
           || CASE WHEN coalesce(geometry <> c_geometry, false) THEN geometry ELSE s_geometry END
           || ' fetched by ' || replica || ' of geometry ' || c_geometry AS message,
       *
FROM audit_fetches
WHERE coalesce(geometry <> c_geometry, false) OR coalesce(s_geometry <> c_geometry, false);
