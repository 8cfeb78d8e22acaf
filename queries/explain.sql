-- explain: every page of a request's prompt, in order: what became of it at the lookup, and why.
--
-- Question: why did this request miss? For each page of its prompt, its cause in the
--   vocabulary of docs/design.md section 7 (hit_gpu, hit_local, hit_pool, rejected,
--   prefix_broken, routed_away, incompatible_producer, evicted, stored_after_lookup,
--   never_stored), the copy the cause is about (where it sat, who stored it, when), the
--   last eviction of the page before the lookup, and whether the page was achievable:
--   part of the longest prefix of which a compatible copy existed anywhere in the fleet
--   (or that was used). `kvaudit explain` shows one request; without a request id every
--   request's pages come back, which `reuse_left` sums up.
-- How: docs/design.md section 7 defines the terms (a request, its lookup and prompt
--   pages; stores, present, reachable and compatible copies), the causes in the order
--   they are decided, and the achievable prefix; this query is that definition in SQL.
-- Parameters: kvaudit_request_id (VARCHAR, default: every request), kvaudit_replica
--   (VARCHAR, default: any replica), kvaudit_trace_id (VARCHAR, default: any; otherwise
--   only requests with a span in that trace).
-- Columns: request_id, replica, lookup_ns, prompt_tokens (the lookup's tokens requested),
--   page (0-based, in token order), token_start, token_end, key, cause, achievable;
--   tier, holder, producer, stored_ns (the copy the cause is about, docs/design.md section
--   7.2: where it sat, the replica whose store held it (NULL: the shared pool), who stored
--   it and when); evicted_ns, evicted_backend, evicted_tier, evicted_replica,
--   evict_reason, evicted_by (the page's last eviction up to the lookup, and the request
--   whose store pushed it out, where traced).
WITH request_spans AS (
    SELECT replica, request_id, trace_id, resource_id, op, start_ns, tokens_requested, tokens_local
    FROM spans
    WHERE op IN ('lookup', 'fetch', 'store') AND request_id IS NOT NULL
      AND (getvariable('kvaudit_request_id') IS NULL OR request_id = getvariable('kvaudit_request_id'))
      AND (getvariable('kvaudit_replica') IS NULL OR replica = getvariable('kvaudit_replica'))
),
requests AS (
    SELECT replica, request_id,
           coalesce(min(start_ns) FILTER (WHERE op = 'lookup'), min(start_ns)) AS lookup_ns,
           coalesce(arg_min(resource_id, start_ns) FILTER (WHERE op = 'lookup'),
                    arg_min(resource_id, start_ns)) AS consumer_id,
           coalesce(max(tokens_requested) FILTER (WHERE op = 'lookup'), max(tokens_requested)) AS prompt_tokens,
           coalesce(max(tokens_local) FILTER (WHERE op = 'lookup'), 0) AS local_tokens
    FROM request_spans
    GROUP BY replica, request_id
    HAVING getvariable('kvaudit_trace_id') IS NULL
        OR count(*) FILTER (WHERE trace_id = getvariable('kvaudit_trace_id')) > 0
),
prompt AS (
    -- One row per page: whether the request's own spans fetched it, used it, or found it local.
    SELECT r.replica, r.request_id, r.lookup_ns, r.consumer_id, r.prompt_tokens, p.token_start,
           min(p.token_end) AS token_end, min(p.key) AS key,
           count(*) FILTER (WHERE p.op = 'fetch') > 0 AS fetched,
           -- A fetched page not shown to be refused counts as used, as in the audit (section 4.1).
           count(*) FILTER (WHERE p.op = 'fetch' AND (p.used IS NULL OR p.used)) > 0 AS used,
           min(p.tier) FILTER (WHERE p.op = 'fetch') AS fetched_tier,
           count(*) FILTER (WHERE p.op = 'lookup' AND p.tier = 'gpu') > 0 OR min(p.token_end) <= r.local_tokens
               AS in_gpu
    FROM pages p
    JOIN requests r ON r.replica = p.replica AND r.request_id = p.request_id
    WHERE p.op IN ('lookup', 'fetch', 'store') AND p.key IS NOT NULL AND p.token_start IS NOT NULL
      AND (getvariable('kvaudit_request_id') IS NULL OR p.request_id = getvariable('kvaudit_request_id'))
      AND (getvariable('kvaudit_replica') IS NULL OR p.replica = getvariable('kvaudit_replica'))
    GROUP BY r.replica, r.request_id, r.lookup_ns, r.consumer_id, r.prompt_tokens, r.local_tokens, p.token_start
),
events AS (
    -- Every store and eviction of the prompts' keys, each in the store it concerns.
    SELECT key, op, time_ns, replica, request_id, span_id, trace_id, tier, store_backend,
           CASE WHEN tier = 'remote' THEN NULL ELSE replica END AS holder,
           model, dtype, layout, world_size, rank, hash_algo, layers, kv_heads, head_size
    FROM (
        -- An LMCache store names each of its targets, comma-separated.
        SELECT key, op, time_ns, replica, request_id, span_id, trace_id, tier,
               unnest(string_split(coalesce(backend, ''), ',')) AS store_backend,
               model, dtype, layout, world_size, rank, hash_algo, layers, kv_heads, head_size
        FROM pages
        WHERE op IN ('store', 'evict') AND key IN (SELECT key FROM prompt)
    ) e
),
copies AS (
    -- A store's copy of a key: present from its store until the key's next event in that store.
    SELECT key, time_ns, replica, request_id, tier, holder, model, dtype, layout, world_size, rank, hash_algo,
           layers, kv_heads, head_size, until_ns
    FROM (
        SELECT *, lead(time_ns, 1, 9223372036854775807)
                      OVER (PARTITION BY key, store_backend, tier, holder ORDER BY time_ns, op = 'store') AS until_ns
        FROM events
    ) t
    WHERE op = 'store'
),
evictions AS (
    SELECT e.key, e.time_ns, e.replica, e.request_id, e.tier, e.holder, e.store_backend, s.evict_reason
    FROM events e
    LEFT JOIN (SELECT trace_id, span_id, evict_reason FROM spans WHERE op = 'evict') s
        ON s.trace_id = e.trace_id AND s.span_id = e.span_id
    WHERE e.op = 'evict'
),
sightings AS (
    -- Each page beside the copies of its key stored up to the lookup (present then or not), and later ones.
    SELECT p.replica, p.request_id, p.token_start, c.time_ns, c.replica AS writer, c.request_id AS writer_request,
           -- '' for none: what the aggregates below pick must not be NULL (an engine may skip NULLs).
           coalesce(c.tier, '') AS tier, coalesce(c.holder, '') AS holder,
           c.time_ns <= p.lookup_ns AND c.until_ns > p.lookup_ns AS present,
           c.holder IS NULL OR c.holder = p.replica AS reachable,
           (c.model IS NULL OR k.model IS NULL OR c.model = k.model)
               AND (c.dtype IS NULL OR k.dtype IS NULL OR c.dtype = k.dtype)
               AND (c.layout IS NULL OR k.layout IS NULL OR c.layout = k.layout)
               AND (c.world_size IS NULL OR k.world_size IS NULL OR c.world_size = k.world_size)
               AND (c.rank IS NULL OR k.rank IS NULL OR c.rank = k.rank)
               AND (c.hash_algo IS NULL OR k.hash_algo IS NULL OR c.hash_algo = k.hash_algo)
               AND (c.layers IS NULL OR k.layers IS NULL OR c.layers = k.layers)
               AND (c.kv_heads IS NULL OR k.kv_heads IS NULL OR c.kv_heads = k.kv_heads)
               AND (c.head_size IS NULL OR k.head_size IS NULL OR c.head_size = k.head_size) AS compatible,
           c.tier = p.fetched_tier AND (c.holder IS NULL OR c.holder = p.replica)
               OR p.in_gpu AND c.tier = 'gpu' AND c.holder = p.replica AS source
    FROM prompt p
    JOIN copies c ON c.key = p.key
    LEFT JOIN replicas k ON k.resource_id = p.consumer_id
),
later_writers AS (
    -- When each request that stored a prompt page after its lookup had itself started.
    SELECT replica, request_id, min(start_ns) AS start_ns
    FROM spans
    WHERE op IN ('lookup', 'fetch', 'store')
      AND request_id IN (SELECT writer_request FROM sightings)
    GROUP BY replica, request_id
),
seen AS (
    SELECT g.replica, g.request_id, g.token_start,
           count(*) FILTER (WHERE g.present AND g.reachable AND g.compatible) > 0 AS near,
           count(*) FILTER (WHERE g.present AND NOT g.reachable AND g.compatible) > 0 AS far,
           count(*) FILTER (WHERE g.present) > 0 AS any_copy,
           count(*) FILTER (WHERE g.time_ns <= p.lookup_ns) > 0 AS stored_before,
           count(*) FILTER (WHERE g.time_ns > p.lookup_ns AND w.start_ns <= p.lookup_ns
                              AND NOT (g.writer = g.replica AND g.writer_request = g.request_id)) > 0 AS raced,
           -- The copy each cause is about: (tier, holder, writer, stored time) of the latest such store.
           arg_max(g.tier, g.time_ns) FILTER (WHERE g.source AND g.time_ns <= p.lookup_ns) AS source_tier,
           arg_max(g.holder, g.time_ns) FILTER (WHERE g.source AND g.time_ns <= p.lookup_ns) AS source_holder,
           arg_max(g.writer, g.time_ns) FILTER (WHERE g.source AND g.time_ns <= p.lookup_ns) AS source_writer,
           max(g.time_ns) FILTER (WHERE g.source AND g.time_ns <= p.lookup_ns) AS source_ns,
           arg_max(g.writer, g.time_ns) FILTER (WHERE g.time_ns <= p.lookup_ns) AS last_writer,
           max(g.time_ns) FILTER (WHERE g.time_ns <= p.lookup_ns) AS last_ns,
           arg_max(g.tier, g.time_ns) FILTER (WHERE g.time_ns <= p.lookup_ns) AS last_tier,
           arg_max(g.holder, g.time_ns) FILTER (WHERE g.time_ns <= p.lookup_ns) AS last_holder,
           arg_max(g.tier, g.time_ns) FILTER (WHERE g.present AND g.reachable AND g.compatible) AS near_tier,
           arg_max(g.holder, g.time_ns) FILTER (WHERE g.present AND g.reachable AND g.compatible) AS near_holder,
           arg_max(g.writer, g.time_ns) FILTER (WHERE g.present AND g.reachable AND g.compatible) AS near_writer,
           max(g.time_ns) FILTER (WHERE g.present AND g.reachable AND g.compatible) AS near_ns,
           arg_max(g.tier, g.time_ns) FILTER (WHERE g.present AND NOT g.reachable AND g.compatible) AS far_tier,
           arg_max(g.holder, g.time_ns) FILTER (WHERE g.present AND NOT g.reachable AND g.compatible) AS far_holder,
           arg_max(g.writer, g.time_ns) FILTER (WHERE g.present AND NOT g.reachable AND g.compatible) AS far_writer,
           max(g.time_ns) FILTER (WHERE g.present AND NOT g.reachable AND g.compatible) AS far_ns,
           arg_max(g.tier, g.time_ns) FILTER (WHERE g.present) AS any_tier,
           arg_max(g.holder, g.time_ns) FILTER (WHERE g.present) AS any_holder,
           arg_max(g.writer, g.time_ns) FILTER (WHERE g.present) AS any_writer,
           max(g.time_ns) FILTER (WHERE g.present) AS any_ns,
           arg_min(g.tier, g.time_ns) FILTER (WHERE g.time_ns > p.lookup_ns) AS next_tier,
           arg_min(g.holder, g.time_ns) FILTER (WHERE g.time_ns > p.lookup_ns) AS next_holder,
           arg_min(g.writer, g.time_ns) FILTER (WHERE g.time_ns > p.lookup_ns) AS next_writer,
           min(g.time_ns) FILTER (WHERE g.time_ns > p.lookup_ns) AS next_ns
    FROM sightings g
    JOIN prompt p ON p.replica = g.replica AND p.request_id = g.request_id AND p.token_start = g.token_start
    LEFT JOIN later_writers w ON w.replica = g.writer AND w.request_id = g.writer_request
    GROUP BY g.replica, g.request_id, g.token_start
),
last_evictions AS (
    -- The last eviction up to the lookup from a store this replica reaches if there was one, else from any store.
    SELECT replica, request_id, token_start,
           max(time_ns) FILTER (WHERE nth = 1) AS evicted_ns,
           max(store_backend) FILTER (WHERE nth = 1) AS evicted_backend,
           max(tier) FILTER (WHERE nth = 1) AS evicted_tier,
           max(evictor) FILTER (WHERE nth = 1) AS evicted_replica,
           max(evict_reason) FILTER (WHERE nth = 1) AS evict_reason,
           max(evicted_by) FILTER (WHERE nth = 1) AS evicted_by
    FROM (
        SELECT p.replica, p.request_id, p.token_start, v.time_ns, v.store_backend, v.tier, v.replica AS evictor,
               v.evict_reason, v.request_id AS evicted_by,
               row_number() OVER (PARTITION BY p.replica, p.request_id, p.token_start
                                  ORDER BY v.holder IS NULL OR v.holder = p.replica DESC, v.time_ns DESC,
                                           v.store_backend, v.tier) AS nth
        FROM prompt p
        JOIN evictions v ON v.key = p.key AND v.time_ns <= p.lookup_ns
    ) ranked
    GROUP BY replica, request_id, token_start
),
decided AS (
    SELECT p.replica, p.request_id, p.lookup_ns, p.prompt_tokens, p.token_start, p.token_end, p.key, p.in_gpu,
           p.fetched_tier, s.source_tier, s.source_holder, s.source_writer, s.source_ns, s.last_tier, s.last_holder,
           s.last_writer, s.last_ns, s.near_tier, s.near_holder, s.near_writer, s.near_ns, s.far_tier, s.far_holder,
           s.far_writer, s.far_ns, s.any_tier, s.any_holder, s.any_writer, s.any_ns, s.next_tier, s.next_holder,
           s.next_writer, s.next_ns,
           CASE
               WHEN p.in_gpu THEN 'hit_gpu'
               WHEN p.used AND coalesce(p.fetched_tier, '') <> 'remote'
                    AND coalesce(s.source_writer, s.last_writer) = p.replica THEN 'hit_local'
               WHEN p.used THEN 'hit_pool'
               WHEN p.fetched AND p.token_start = min(CASE WHEN p.fetched AND NOT p.used THEN p.token_start END)
                        OVER (PARTITION BY p.replica, p.request_id) THEN 'rejected'
               WHEN p.fetched OR s.near THEN 'prefix_broken'
               WHEN s.far THEN 'routed_away'
               WHEN s.any_copy THEN 'incompatible_producer'
               WHEN s.stored_before THEN 'evicted'
               WHEN s.raced THEN 'stored_after_lookup'
               ELSE 'never_stored'
           END AS cause,
           -- Achievable: used, or a compatible copy present anywhere in the fleet at the lookup.
           p.used OR p.in_gpu OR coalesce(s.near, false) OR coalesce(s.far, false) AS available
    FROM prompt p
    LEFT JOIN seen s ON s.replica = p.replica AND s.request_id = p.request_id AND s.token_start = p.token_start
)
SELECT d.request_id, d.replica, d.lookup_ns, d.prompt_tokens,
       row_number() OVER (PARTITION BY d.replica, d.request_id ORDER BY d.token_start) - 1 AS page,
       d.token_start, d.token_end, d.key, d.cause,
       d.token_start < coalesce(min(CASE WHEN NOT d.available THEN d.token_start END)
                                    OVER (PARTITION BY d.replica, d.request_id), 9223372036854775807) AS achievable,
       nullif(CASE WHEN d.cause IN ('hit_gpu', 'hit_local', 'hit_pool', 'rejected')
                       THEN CASE WHEN d.in_gpu THEN 'gpu' ELSE d.fetched_tier END
                   WHEN d.cause = 'prefix_broken' THEN d.near_tier
                   WHEN d.cause = 'routed_away' THEN d.far_tier
                   WHEN d.cause = 'incompatible_producer' THEN d.any_tier
                   WHEN d.cause = 'evicted' THEN d.last_tier
                   WHEN d.cause = 'stored_after_lookup' THEN d.next_tier END, '') AS tier,
       nullif(CASE WHEN d.cause IN ('hit_gpu', 'hit_local', 'hit_pool', 'rejected')
                       THEN CASE WHEN d.source_writer IS NULL THEN d.last_holder ELSE d.source_holder END
                   WHEN d.cause = 'prefix_broken' THEN d.near_holder
                   WHEN d.cause = 'routed_away' THEN d.far_holder
                   WHEN d.cause = 'incompatible_producer' THEN d.any_holder
                   WHEN d.cause = 'evicted' THEN d.last_holder
                   WHEN d.cause = 'stored_after_lookup' THEN d.next_holder END, '') AS holder,
       CASE WHEN d.cause IN ('hit_gpu', 'hit_local', 'hit_pool', 'rejected') THEN coalesce(d.source_writer, d.last_writer)
            WHEN d.cause = 'prefix_broken' THEN d.near_writer
            WHEN d.cause = 'routed_away' THEN d.far_writer
            WHEN d.cause = 'incompatible_producer' THEN d.any_writer
            WHEN d.cause = 'evicted' THEN d.last_writer
            WHEN d.cause = 'stored_after_lookup' THEN d.next_writer END AS producer,
       CASE WHEN d.cause IN ('hit_gpu', 'hit_local', 'hit_pool', 'rejected') THEN coalesce(d.source_ns, d.last_ns)
            WHEN d.cause = 'prefix_broken' THEN d.near_ns
            WHEN d.cause = 'routed_away' THEN d.far_ns
            WHEN d.cause = 'incompatible_producer' THEN d.any_ns
            WHEN d.cause = 'evicted' THEN d.last_ns
            WHEN d.cause = 'stored_after_lookup' THEN d.next_ns END AS stored_ns,
       v.evicted_ns, v.evicted_backend, v.evicted_tier, v.evicted_replica, v.evict_reason, v.evicted_by
FROM decided d
LEFT JOIN last_evictions v ON v.replica = d.replica AND v.request_id = d.request_id AND v.token_start = d.token_start
ORDER BY d.replica, d.request_id, d.token_start
