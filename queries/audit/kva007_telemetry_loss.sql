-- KVA007 telemetry-loss: the traces are known to be incomplete, so the audit is too.
--
-- What it catches: (1) lines of trace files that could not be read (`read_errors`,
--   one finding per line, with file and line); (2) spans whose exporter dropped events
--   (page descriptors) or attributes, counted in the span itself; (3) processes whose
--   `kvaudit.telemetry` spans report dropped spans, failed exports, emission errors or
--   lost batches of an engine's KV events (the counts are cumulative per process, so
--   the largest is the total).
-- Why it matters: a page that was never described cannot be audited; a clean audit of
--   incomplete traces must not read as a clean fleet.
-- Reads: read_errors, spans.
-- Columns: the columns of kvaudit.analyse.audit.Finding; fields is a JSON object: the reason of
--   an unreadable line, or the loss counts.
SELECT 'KVA007' AS code,
       'telemetry-loss' AS rule,
       'warning' AS severity,
       CAST(NULL AS VARCHAR) AS replica,
       CAST(NULL AS VARCHAR) AS key,
       CAST(NULL AS VARCHAR) AS trace_id,
       CAST(NULL AS VARCHAR) AS span_id,
       json_object('reason', reason) AS fields,
       'unreadable trace line: ' || reason AS message,
       CAST(NULL AS VARCHAR) AS producer,
       file,
       line
FROM read_errors
UNION ALL
SELECT 'KVA007', 'telemetry-loss', 'warning', replica, CAST(NULL AS VARCHAR), trace_id, span_id,
       json_object('dropped_events', dropped_events, 'dropped_attributes', dropped_attributes),
       'span lost ' || coalesce(dropped_events, 0) || ' events (page descriptors) and '
           || coalesce(dropped_attributes, 0) || ' attributes',
       CAST(NULL AS VARCHAR), file, line
FROM spans
WHERE dropped_events > 0 OR dropped_attributes > 0
UNION ALL
SELECT 'KVA007', 'telemetry-loss', 'warning', replica, CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR),
       CAST(NULL AS VARCHAR),
       json_object('dropped_spans', dropped_spans, 'failed_exports', failed_exports, 'errors', errors,
                   'lost_batches', lost_batches),
       'emitter reported ' || dropped_spans || ' dropped spans, ' || failed_exports || ' failed exports, '
           || errors || ' emission errors, ' || lost_batches || ' lost KV event batches',
       CAST(NULL AS VARCHAR), max_file, CAST(NULL AS BIGINT)
FROM (
    SELECT resource_id, max(replica) AS replica, max(file) AS max_file,
           coalesce(max(telemetry_dropped_spans), 0) AS dropped_spans,
           coalesce(max(telemetry_failed_exports), 0) AS failed_exports,
           coalesce(max(telemetry_errors), 0) AS errors,
           coalesce(max(telemetry_lost_batches), 0) AS lost_batches
    FROM spans
    WHERE telemetry_dropped_spans IS NOT NULL OR telemetry_failed_exports IS NOT NULL
       OR telemetry_errors IS NOT NULL OR telemetry_lost_batches IS NOT NULL
    GROUP BY resource_id
) t
WHERE dropped_spans > 0 OR failed_exports > 0 OR errors > 0 OR lost_batches > 0;
