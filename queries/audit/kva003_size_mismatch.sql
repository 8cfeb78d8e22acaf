-- KVA003 size-mismatch: a fetched page's bytes differ from its shape times its dtype's size.
--
-- What it catches: fetched pages whose `bytes` is not the product of `shape` times the
--   element size of `dtype` (pages lacking one of the three are KVA001's).
-- Why it matters: a payload whose size does not match its own declared geometry is
--   truncated, padded or described wrongly: reading it as that shape reads garbage.
-- Reads: audit_fetches (queries/audit/lineage.sql, which the auditor puts before the rules) and dtype_sizes (dtype, bytes),
--   which `kvaudit audit` creates from kvaudit.contract.DTYPE_BYTES; a dtype missing
--   from it cannot be checked.
-- Columns: code, rule, fields, message and the columns of audit_fetches (the auditor keeps those
--   of kvaudit.analyse.audit.Finding); fields is a JSON object field ->
--   {"fetched": ..., "expected": ...}.
WITH sized AS (
    -- The product per page, not once per distinct shape: joining every page to a table of
    -- shapes on a list-valued key costs more than multiplying a handful of numbers.
    -- list_product, not unnest: it reads ClickHouse's nullable arrays too (queries/README.md).
    SELECT f.*, CAST(list_product(f.shape) AS BIGINT) * d.bytes AS expected_bytes
    FROM audit_fetches f
    JOIN dtype_sizes d ON d.dtype = f.dtype
)
SELECT 'KVA003' AS code,
       'size-mismatch' AS rule,
       json_object(
           'bytes', json_object('fetched', bytes, 'expected', expected_bytes),
           'shape', json_object('fetched', shape),
           'dtype', json_object('fetched', dtype)) AS fields,
       'fetched page has ' || bytes || ' bytes, its shape and dtype make ' || expected_bytes AS message,
       *
FROM sized
WHERE bytes <> expected_bytes;
