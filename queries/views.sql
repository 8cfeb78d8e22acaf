-- views: the kvaudit views (spans, pages, replicas, read_errors) over raw OTLP JSON trace
-- files, for the plain duckdb shell, without kvaudit installed.
--
--   SET VARIABLE kvaudit_traces = 'traces/*.jsonl';
--   .read queries/views.sql
--   .read queries/hit_rate.sql
--
-- Question: none; it defines the views every named query reads, with the same columns as
--           kvaudit.read.store (see its docstring), so a query runs the same here, from
--           `kvaudit sql` and over a database written by `kvaudit ingest`.
-- Parameters: kvaudit_traces (VARCHAR): a trace file or glob (directories: give 'dir/*.jsonl').
-- Columns: as kvaudit.read.store. Two differences: resource_id is a hash of the resource's
--          attributes as written (kvaudit's reader hashes them decoded and sorted, so the
--          ids differ between the two while grouping the same processes), and the reason
--          text of read_errors is shorter.
-- This file is DuckDB's own SQL (read_text, JSON functions, lambdas): it stands in for the
-- reader, which has no portable form. The named queries themselves keep to portable SQL.
-- It reads every line with JSON functions, far slower than `kvaudit ingest`: fine
-- for a few files, use `kvaudit ingest` for large ones.

-- kvaudit SQL's key_id(key), which the named queries group and join keys by: the key itself.
CREATE OR REPLACE MACRO key_id(key) AS key;
CREATE OR REPLACE MACRO kvaudit_attrs(list) AS
    map_from_entries(list_transform(json_extract(list, '$[*]'), lambda a: {'k': a ->> '$.key', 'v': a -> '$.value'}));
CREATE OR REPLACE MACRO kvaudit_str(attrs, name) AS attrs[name] ->> '$.stringValue';
CREATE OR REPLACE MACRO kvaudit_int(attrs, name) AS CAST(attrs[name] ->> '$.intValue' AS BIGINT);
CREATE OR REPLACE MACRO kvaudit_bool(attrs, name) AS CAST(attrs[name] ->> '$.boolValue' AS BOOLEAN);
CREATE OR REPLACE MACRO kvaudit_ints(attrs, name) AS
    CAST(json_extract_string(attrs[name], '$.arrayValue.values[*].intValue') AS BIGINT[]);
-- Ids are hex in OTLP JSON; protobuf's JSON mapping writes them as base64.
CREATE OR REPLACE MACRO kvaudit_id(value, size) AS
    CASE WHEN value IS NULL OR value = '' THEN NULL
         WHEN length(value) = 2 * size THEN lower(value)
         ELSE lower(hex(from_base64(value))) END;

CREATE OR REPLACE TABLE kvaudit_lines AS
WITH files AS (
    SELECT filename, content, string_split(content, chr(10)) AS lines
    FROM read_text(getvariable('kvaudit_traces'))
)
SELECT filename AS file, line, raw, NOT ends_with(content, chr(10)) AND line = len(lines) AS unterminated
FROM (SELECT filename, content, lines, unnest(lines) AS raw, generate_subscripts(lines, 1) AS line FROM files) f
WHERE trim(raw) <> '';

CREATE OR REPLACE TABLE kvaudit_resource_spans AS
SELECT file, line, rs,
       kvaudit_attrs(rs -> '$.resource.attributes') AS res,
       CAST(hash(coalesce(CAST(rs -> '$.resource.attributes' AS VARCHAR), '')) >> 1 AS BIGINT) AS resource_id
FROM (
    SELECT file, line, unnest(json_extract(CAST(raw AS JSON), '$.resourceSpans[*]')) AS rs
    FROM kvaudit_lines
    WHERE json_valid(raw) AND json_type(CAST(raw AS JSON), '$.resourceSpans') = 'ARRAY'
) r;

CREATE OR REPLACE VIEW read_errors AS
SELECT file, line,
       CASE WHEN unterminated THEN 'truncated last line (writer stopped mid-line?)'
            WHEN NOT json_valid(raw) THEN 'invalid JSON'
            ELSE 'not OTLP trace data' END AS reason
FROM kvaudit_lines
WHERE NOT json_valid(raw) OR coalesce(json_type(CAST(raw AS JSON), '$.resourceSpans'), '') <> 'ARRAY'
UNION ALL
SELECT DISTINCT file, line, 'unknown kvaudit schema version ' || kvaudit_int(res, 'kvaudit.schema')
FROM kvaudit_resource_spans
WHERE kvaudit_int(res, 'kvaudit.schema') <> 1;

-- Resource spans of lines that are readable as a whole (a line with a bad schema is not).
CREATE OR REPLACE VIEW kvaudit_good_resource_spans AS
SELECT * FROM kvaudit_resource_spans r
WHERE NOT EXISTS (SELECT 1 FROM read_errors e WHERE e.file = r.file AND e.line = r.line);

CREATE OR REPLACE VIEW replicas AS
SELECT DISTINCT resource_id,
       kvaudit_str(res, 'service.instance.id') AS replica,
       kvaudit_str(res, 'service.name') AS service,
       kvaudit_int(res, 'process.pid') AS pid,
       kvaudit_str(res, 'process.creation.time') AS started,
       kvaudit_int(res, 'kvaudit.schema') AS schema,
       kvaudit_str(res, 'kvaudit.engine') AS engine,
       kvaudit_str(res, 'kvaudit.engine.version') AS engine_version,
       CAST(res['kvaudit.sample.rate'] ->> '$.doubleValue' AS DOUBLE) AS sample_rate,
       kvaudit_str(res, 'kvaudit.kv.model') AS model,
       kvaudit_str(res, 'kvaudit.kv.dtype') AS dtype,
       kvaudit_str(res, 'kvaudit.kv.layout') AS layout,
       kvaudit_int(res, 'kvaudit.kv.block_size') AS block_size,
       kvaudit_int(res, 'kvaudit.kv.world_size') AS world_size,
       kvaudit_int(res, 'kvaudit.kv.rank') AS rank,
       kvaudit_str(res, 'kvaudit.kv.hash_algo') AS hash_algo,
       kvaudit_int(res, 'kvaudit.kv.layers') AS layers,
       kvaudit_int(res, 'kvaudit.kv.kv_heads') AS kv_heads,
       kvaudit_int(res, 'kvaudit.kv.head_size') AS head_size,
       kvaudit_str(res, 'kvaudit.kv.geometry') AS geometry
FROM kvaudit_good_resource_spans;

CREATE OR REPLACE TABLE kvaudit_raw_spans AS
SELECT file, line, resource_id, kvaudit_str(res, 'service.instance.id') AS replica, s,
       kvaudit_attrs(s -> '$.attributes') AS attrs
FROM (
    SELECT file, line, resource_id, res, unnest(json_extract(ss, '$.spans[*]')) AS s
    FROM (SELECT file, line, resource_id, res, unnest(json_extract(rs, '$.scopeSpans[*]')) AS ss
          FROM kvaudit_good_resource_spans) x
) y;

CREATE OR REPLACE VIEW kvaudit_spans AS
SELECT file, line, resource_id, replica,
       kvaudit_id(s ->> '$.traceId', 16) AS trace_id,
       kvaudit_id(s ->> '$.spanId', 8) AS span_id,
       kvaudit_id(s ->> '$.parentSpanId', 8) AS parent_span_id,
       coalesce(s ->> '$.name', '') AS name,
       CAST(coalesce(s ->> '$.startTimeUnixNano', '0') AS BIGINT) AS start_ns,
       CAST(coalesce(s ->> '$.endTimeUnixNano', '0') AS BIGINT) AS end_ns,
       CAST(coalesce(s ->> '$.status.code', '0') AS BIGINT) AS status_code,
       CAST(coalesce(s ->> '$.droppedAttributesCount', '0') AS BIGINT) AS dropped_attributes,
       CAST(coalesce(s ->> '$.droppedEventsCount', '0') AS BIGINT) AS dropped_events,
       kvaudit_str(attrs, 'kvaudit.op') AS op,
       kvaudit_str(attrs, 'kvaudit.request.id') AS request_id,
       kvaudit_str(attrs, 'kvaudit.hook') AS hook,
       kvaudit_str(attrs, 'kvaudit.backend') AS backend,
       kvaudit_int(attrs, 'kvaudit.tokens.requested') AS tokens_requested,
       kvaudit_int(attrs, 'kvaudit.tokens.hit') AS tokens_hit,
       kvaudit_int(attrs, 'kvaudit.tokens.stored') AS tokens_stored,
       kvaudit_int(attrs, 'kvaudit.tokens.local') AS tokens_local,
       kvaudit_int(attrs, 'kvaudit.pages') AS pages,
       kvaudit_int(attrs, 'kvaudit.bytes') AS bytes,
       kvaudit_str(attrs, 'kvaudit.outcome') AS outcome,
       kvaudit_str(attrs, 'kvaudit.evict.reason') AS evict_reason,
       kvaudit_int(attrs, 'kvaudit.block_size') AS block_size,
       kvaudit_int(attrs, 'kvaudit.telemetry.dropped_spans') AS telemetry_dropped_spans,
       kvaudit_int(attrs, 'kvaudit.telemetry.failed_exports') AS telemetry_failed_exports,
       kvaudit_int(attrs, 'kvaudit.telemetry.errors') AS telemetry_errors,
       kvaudit_int(attrs, 'kvaudit.telemetry.lost_batches') AS telemetry_lost_batches,
       -- Attributes outside the contract, as text: a string as it is, anything else as JSON.
       CASE WHEN len(other) > 0 THEN map_from_entries(other) END AS attributes,
       s
FROM (
    SELECT *,
           list_transform(
               list_filter(map_entries(attrs), lambda e: e.key NOT IN (
                   'kvaudit.op', 'kvaudit.request.id', 'kvaudit.hook', 'kvaudit.backend',
                   'kvaudit.tokens.requested', 'kvaudit.tokens.hit', 'kvaudit.tokens.stored', 'kvaudit.tokens.local', 'kvaudit.pages',
                   'kvaudit.bytes', 'kvaudit.outcome', 'kvaudit.evict.reason', 'kvaudit.block_size',
                   'kvaudit.telemetry.dropped_spans', 'kvaudit.telemetry.failed_exports',
                   'kvaudit.telemetry.errors', 'kvaudit.telemetry.lost_batches')),
               lambda e: {'key': e.key,
                     'value': coalesce(json_extract_string(e.value, '$.stringValue'),
                                       CAST(json_extract(e.value, '$.*')[1] AS VARCHAR))}) AS other
    FROM kvaudit_raw_spans
) z
-- One row per span identity: a span on disk twice (an OTLP retry, a file collected twice)
-- is read once, its first copy by file and line (docs/design.md section 3.1).
QUALIFY coalesce(trace_id, '') = '' OR coalesce(span_id, '') = ''
    OR row_number() OVER (PARTITION BY trace_id, span_id ORDER BY file, line) = 1;

CREATE OR REPLACE VIEW spans AS
SELECT * EXCLUDE (attributes, s),
       make_timestamp_ns(start_ns) AS start_time,
       make_timestamp_ns(end_ns) AS end_time,
       (end_ns - start_ns) / 1e6 AS duration_ms,
       attributes
FROM kvaudit_spans;

CREATE OR REPLACE VIEW pages AS
SELECT file, line, resource_id, replica, trace_id, span_id, op, hook, backend, request_id, outcome,
       CAST(coalesce(e ->> '$.timeUnixNano', '0') AS BIGINT) AS time_ns,
       kvaudit_str(a, 'kvaudit.page.key') AS key,
       kvaudit_str(a, 'kvaudit.page.hash_algo') AS hash_algo,
       kvaudit_int(a, 'kvaudit.page.token_start') AS token_start,
       kvaudit_int(a, 'kvaudit.page.token_end') AS token_end,
       kvaudit_str(a, 'kvaudit.page.model') AS model,
       kvaudit_str(a, 'kvaudit.page.dtype') AS dtype,
       kvaudit_ints(a, 'kvaudit.page.shape') AS shape,
       kvaudit_str(a, 'kvaudit.page.layout') AS layout,
       kvaudit_int(a, 'kvaudit.page.bytes') AS bytes,
       kvaudit_int(a, 'kvaudit.page.world_size') AS world_size,
       kvaudit_int(a, 'kvaudit.page.rank') AS rank,
       kvaudit_int(a, 'kvaudit.page.layers') AS layers,
       kvaudit_int(a, 'kvaudit.page.kv_heads') AS kv_heads,
       kvaudit_int(a, 'kvaudit.page.head_size') AS head_size,
       kvaudit_bool(a, 'kvaudit.page.used') AS used,
       kvaudit_str(a, 'kvaudit.page.checksum') AS checksum,
       kvaudit_str(a, 'kvaudit.page.transfer') AS transfer,
       kvaudit_int(a, 'kvaudit.page.address') AS address,
       kvaudit_str(a, 'kvaudit.page.tier') AS tier,
       kvaudit_str(a, 'kvaudit.page.source_key') AS source_key,
       kvaudit_str(a, 'kvaudit.page.geometry') AS geometry,
       kvaudit_int(a, 'kvaudit.page.kv_group') AS kv_group,
       kvaudit_str(a, 'kvaudit.page.kv_group_kind') AS kv_group_kind,
       kvaudit_int(a, 'kvaudit.page.sliding_window') AS sliding_window,
       make_timestamp_ns(CAST(coalesce(e ->> '$.timeUnixNano', '0') AS BIGINT)) AS time
FROM (
    SELECT *, kvaudit_attrs(e -> '$.attributes') AS a
    FROM (SELECT *, unnest(json_extract(s, '$.events[*]')) AS e FROM kvaudit_spans) x
    WHERE e ->> '$.name' = 'kvaudit.page'
) y;
