-- explain_evictions: the pages of `explain`, each with its last eviction before its request's lookup.
-- Includes: explain AS explain_pages
-- Includes: store_events AS store_events
--
-- Question: where did the copies of a request's pages go? For each page that `explain`
--   gives (queries/explain.sql, read here as `explain_pages`), the last eviction of its
--   key up to the lookup from a store the request's replica reaches (the shared pool, or
--   its own GPU cache and tiers) if there was one, else from any store (docs/design.md
--   section 7.2): what `kvaudit explain` shows beside each page. Kept apart from
--   `explain` so that `reuse_left`, which sums every request's pages, does not pay for it.
-- Parameters: explain's (kvaudit_request_id, kvaudit_replica, kvaudit_trace_id).
-- Columns: explain's, then evicted_ns, evicted_backend, evicted_tier, evicted_replica,
--   evict_reason (the evict span's kvaudit.evict.reason) and evicted_by (the evict span's
--   request: the one whose store pushed the page out, where the trace names one).
WITH evictions AS (
    -- Each eviction of the pages' keys, in the store it ended (queries/store_events.sql); `seq`
    -- as explain orders events: a lookup at time T sees an eviction at T (2T <= 2T + 1).
    SELECT e.key, e.kv_group, e.time_ns, e.seq, e.replica, e.request_id, nullif(e.backend, '') AS backend, e.tier, e.holder, s.evict_reason
    FROM store_events e
    LEFT JOIN (SELECT trace_id, span_id, evict_reason FROM spans WHERE op = 'evict') s
        ON s.trace_id = e.trace_id AND s.span_id = e.span_id
    WHERE e.op = 'evict' AND e.key IN (SELECT key FROM explain_pages)
),
looked_up AS (
    SELECT request_id, replica, lookup_ns, lookup_ns * 2 + 1 AS at_seq, prompt_tokens, page, token_start,
           token_end, key, kv_group, kv_group_kind, cause, achievable, counted, tier, holder, producer, stored_ns
    FROM explain_pages
),
last_evictions AS (
    SELECT p.request_id, p.replica, p.lookup_ns, p.prompt_tokens, p.page, p.token_start, p.token_end, p.key,
           p.kv_group, p.kv_group_kind, p.cause, p.achievable, p.counted, p.tier, p.holder, p.producer, p.stored_ns,
           CASE WHEN shared.seq IS NULL AND own.seq IS NULL THEN 'any'
                WHEN own.seq IS NULL OR shared.seq > own.seq THEN 'shared'
                ELSE 'own' END AS which,
           shared.time_ns AS shared_ns, shared.backend AS shared_backend, shared.tier AS shared_tier,
           shared.replica AS shared_replica, shared.evict_reason AS shared_reason, shared.request_id AS shared_by,
           own.time_ns AS own_ns, own.backend AS own_backend, own.tier AS own_tier,
           own.replica AS own_replica, own.evict_reason AS own_reason, own.request_id AS own_by,
           anywhere.time_ns AS any_ns, anywhere.backend AS any_backend, anywhere.tier AS any_tier,
           anywhere.replica AS any_replica, anywhere.evict_reason AS any_reason, anywhere.request_id AS any_by
    FROM looked_up p
    ASOF LEFT JOIN (SELECT * FROM evictions WHERE holder = '') shared
        ON shared.key = p.key AND shared.kv_group = p.kv_group AND shared.seq <= p.at_seq
    ASOF LEFT JOIN evictions own
        ON own.key = p.key AND own.kv_group = p.kv_group AND own.holder = p.replica AND own.seq <= p.at_seq
    ASOF LEFT JOIN evictions anywhere
        ON anywhere.key = p.key AND anywhere.kv_group = p.kv_group AND anywhere.seq <= p.at_seq
)
SELECT request_id, replica, lookup_ns, prompt_tokens, page, token_start, token_end, key, kv_group, kv_group_kind,
       cause, achievable, counted, tier, holder, producer, stored_ns,
       CASE which WHEN 'shared' THEN shared_ns WHEN 'own' THEN own_ns ELSE any_ns END AS evicted_ns,
       CASE which WHEN 'shared' THEN shared_backend WHEN 'own' THEN own_backend ELSE any_backend END
           AS evicted_backend,
       nullif(CASE which WHEN 'shared' THEN shared_tier WHEN 'own' THEN own_tier ELSE any_tier END, '')
           AS evicted_tier,
       CASE which WHEN 'shared' THEN shared_replica WHEN 'own' THEN own_replica ELSE any_replica END
           AS evicted_replica,
       CASE which WHEN 'shared' THEN shared_reason WHEN 'own' THEN own_reason ELSE any_reason END AS evict_reason,
       CASE which WHEN 'shared' THEN shared_by WHEN 'own' THEN own_by ELSE any_by END AS evicted_by
FROM last_evictions
ORDER BY replica, request_id, lookup_ns, kv_group, token_start
