-- explain: every page of a request's prompt, in order: what became of it at the lookup, and why.
-- Includes: store_events AS store_events
--
-- Question: why did this request miss? For each page of its prompt, its cause in the
--   vocabulary of docs/design.md section 7 (hit_gpu, hit_local, hit_pool, rejected,
--   outside_window, prefix_broken, routed_away, incompatible_producer, evicted, stored_after_lookup,
--   never_stored), the copy the cause is about (where it sat, who stored it, when), and
--   whether the page was achievable: part of the longest prefix of which a compatible
--   copy existed anywhere in the fleet (or that was used). `kvaudit explain` shows one request; without a request id every
--   request's pages come back, which `reuse_left` sums up.
-- How: docs/design.md section 7 defines the terms (a request, its lookup and prompt
--   pages; stores, present, reachable and compatible copies), the causes in the order
--   they are decided, and the achievable prefix; this query is that definition in SQL.
-- Parameters: kvaudit_request_id (VARCHAR, default: every request), kvaudit_replica
--   (VARCHAR, default: any replica), kvaudit_trace_id (VARCHAR, default: any; otherwise
--   only requests with a span in that trace), kvaudit_since_ns (BIGINT, default: every
--   request; otherwise only those looked up from then on, Unix ns: a window's requests,
--   each still explained over all the traces).
-- Columns: request_id, replica, lookup_ns, prompt_tokens (the lookup's tokens requested),
--   page (0-based, in group then token order), token_start, token_end, key, kv_group (0 where
--   the traces name none), kv_group_kind, cause, achievable, counted (the page stands for its
--   tokens in sums: one page per token range, a missed one before a hit, none dropped by design
--   before either, then the first group's);
--   tier, holder, producer, stored_ns (the copy the cause is about, docs/design.md section
--   7.2: where it sat, the replica whose store held it (NULL: the shared pool), who stored
--   it and when). `explain_evictions` adds each page's last eviction.
WITH id_spans AS (
    -- Each span of a request id on a replica, with the id's latest lookup and latest fetch or
    -- store on that replica before it.
    SELECT replica, request_id, trace_id, span_id, resource_id, op, start_ns, tokens_requested, tokens_local,
           max(CASE WHEN op = 'lookup' THEN start_ns END) OVER before AS last_lookup_ns,
           max(CASE WHEN op <> 'lookup' THEN start_ns END) OVER before AS last_io_ns
    FROM spans
    WHERE op IN ('lookup', 'fetch', 'store') AND request_id IS NOT NULL
      AND (getvariable('kvaudit_request_id') IS NULL OR request_id = getvariable('kvaudit_request_id'))
      AND (getvariable('kvaudit_replica') IS NULL OR replica = getvariable('kvaudit_replica'))
    WINDOW before AS (PARTITION BY replica, request_id
                      ORDER BY start_ns, CASE WHEN op = 'lookup' THEN 0 ELSE 1 END, span_id
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
request_spans AS (
    -- A lookup of an id fetched or stored since its last lookup starts another request of
    -- that id (vLLM's offline ids restart with every process): `ordinal` numbers them.
    SELECT *,
           sum(CASE WHEN op = 'lookup' AND last_io_ns >= coalesce(last_lookup_ns, last_io_ns) THEN 1 ELSE 0 END)
               OVER (PARTITION BY replica, request_id
                     ORDER BY start_ns, CASE WHEN op = 'lookup' THEN 0 ELSE 1 END, span_id
                     ROWS UNBOUNDED PRECEDING) AS ordinal
    FROM id_spans
),
requests AS (
    SELECT replica, request_id, ordinal,
           coalesce(min(start_ns) FILTER (WHERE op = 'lookup'), min(start_ns)) AS lookup_ns,
           coalesce(arg_min(resource_id, start_ns) FILTER (WHERE op = 'lookup'),
                    arg_min(resource_id, start_ns)) AS consumer_id,
           coalesce(max(tokens_requested) FILTER (WHERE op = 'lookup'), max(tokens_requested)) AS prompt_tokens,
           max(tokens_requested) FILTER (WHERE op = 'lookup') AS looked_up_tokens,
           coalesce(max(tokens_local) FILTER (WHERE op = 'lookup'), 0) AS local_tokens
    FROM request_spans
    GROUP BY replica, request_id, ordinal
    HAVING (getvariable('kvaudit_trace_id') IS NULL
            OR count(*) FILTER (WHERE trace_id = getvariable('kvaudit_trace_id')) > 0)
       AND (getvariable('kvaudit_since_ns') IS NULL
            OR coalesce(min(start_ns) FILTER (WHERE op = 'lookup'), min(start_ns)) >= getvariable('kvaudit_since_ns'))
),
prompt AS (
    -- One row per page: whether the request's own spans fetched it, used it, or found it local.
    -- A hybrid model's KV cache groups hold a page each for the same tokens: one row per group.
    SELECT r.replica, r.request_id, r.lookup_ns, r.lookup_ns * 2 + 1 AS at_seq, r.consumer_id, r.prompt_tokens,
           p.token_start, coalesce(p.kv_group, 0) AS kv_group,
           min(p.token_end) AS token_end, min(p.key) AS key,
           min(p.kv_group_kind) AS kv_group_kind, min(p.sliding_window) AS sliding_window,
           count(*) FILTER (WHERE p.op = 'fetch') > 0 AS fetched,
           -- A fetched page not shown to be refused counts as used, as in the audit (section 4.1).
           count(*) FILTER (WHERE p.op = 'fetch' AND (p.used IS NULL OR p.used)) > 0 AS used,
           min(p.tier) FILTER (WHERE p.op = 'fetch') AS fetched_tier,
           count(*) FILTER (WHERE p.op = 'lookup' AND p.tier = 'gpu') > 0 OR min(p.token_end) <= r.local_tokens
               AS in_gpu
    FROM pages p
    JOIN request_spans s ON s.trace_id = p.trace_id AND s.span_id = p.span_id AND s.replica = p.replica
    JOIN requests r ON r.replica = s.replica AND r.request_id = s.request_id AND r.ordinal = s.ordinal
    WHERE p.op IN ('lookup', 'fetch', 'store') AND p.key IS NOT NULL AND p.token_start IS NOT NULL
      -- A page the request stored past the tokens its lookup asked for (its output) is no prompt page.
      AND (r.looked_up_tokens IS NULL OR p.token_end <= r.looked_up_tokens)
      AND (getvariable('kvaudit_request_id') IS NULL OR p.request_id = getvariable('kvaudit_request_id'))
      AND (getvariable('kvaudit_replica') IS NULL OR p.replica = getvariable('kvaudit_replica'))
    GROUP BY r.replica, r.request_id, r.lookup_ns, r.consumer_id, r.prompt_tokens, r.local_tokens, p.token_start,
             coalesce(p.kv_group, 0)
),
events AS (
    -- Every store and eviction of the prompts' keys, each in the store it concerns
    -- (queries/store_events.sql: the one rule for which copy an eviction ended).
    SELECT key, kv_group, op, time_ns, seq, replica, request_id, tier, backend AS store_backend, holder,
           model, dtype, layout, world_size, rank, hash_algo, layers, kv_heads, head_size
    FROM store_events
    WHERE key IN (SELECT key FROM prompt)
),
segments AS (
    -- Each store of a page's key, with the `seq` of the key's next event in the same store:
    -- the copy it wrote is present from the one to the other.
    SELECT *, lead(seq, 1, 9223372036854775807)
                  OVER (PARTITION BY key, kv_group, store_backend, tier, holder ORDER BY seq) AS until_seq
    FROM events
),
first_stores AS (
    -- An eviction proves an earlier store, recorded or not (a sampled trace, lost spans).
    SELECT key, kv_group, min(seq) AS first_seq FROM events GROUP BY key, kv_group
),
copies AS (
    -- Each page beside every copy of its key present at its lookup, anywhere in the fleet.
    SELECT p.replica, p.request_id, p.lookup_ns, p.token_start, p.kv_group, c.time_ns, c.replica AS writer, c.tier, c.holder,
           c.holder = '' OR c.holder = p.replica AS reachable,
           (c.model IS NULL OR k.model IS NULL OR c.model = k.model)
               AND (c.dtype IS NULL OR k.dtype IS NULL OR c.dtype = k.dtype)
               AND (c.layout IS NULL OR k.layout IS NULL OR c.layout = k.layout)
               AND (c.world_size IS NULL OR k.world_size IS NULL OR c.world_size = k.world_size)
               AND (c.rank IS NULL OR k.rank IS NULL OR c.rank = k.rank)
               AND (c.hash_algo IS NULL OR k.hash_algo IS NULL OR c.hash_algo = k.hash_algo)
               AND (c.layers IS NULL OR k.layers IS NULL OR c.layers = k.layers)
               AND (c.kv_heads IS NULL OR k.kv_heads IS NULL OR c.kv_heads = k.kv_heads)
               AND (c.head_size IS NULL OR k.head_size IS NULL OR c.head_size = k.head_size) AS compatible,
           -- The store a used page came from: its fetched tier, this replica's or shared; the GPU for hit_gpu.
           c.tier = coalesce(p.fetched_tier, '') AND (c.holder = '' OR c.holder = p.replica)
               OR p.in_gpu AND c.tier = 'gpu' AND c.holder = p.replica AS source
    FROM prompt p
    JOIN segments c ON c.key = p.key AND c.kv_group = p.kv_group AND c.op = 'store' AND c.seq <= p.at_seq AND c.until_seq > p.at_seq
    LEFT JOIN replicas k ON k.resource_id = p.consumer_id
),
seen AS (
    -- What each page's present copies say, and the copy each cause is about: (tier, holder,
    -- writer, stored time) of the latest such copy ('' for none: an engine may skip NULLs).
    SELECT replica, request_id, lookup_ns, token_start, kv_group,
           count(*) FILTER (WHERE reachable AND compatible) > 0 AS near,
           count(*) FILTER (WHERE NOT reachable AND compatible) > 0 AS far,
           arg_max(tier, time_ns) FILTER (WHERE source) AS source_tier,
           arg_max(holder, time_ns) FILTER (WHERE source) AS source_holder,
           arg_max(writer, time_ns) FILTER (WHERE source) AS source_writer,
           max(time_ns) FILTER (WHERE source) AS source_ns,
           arg_max(tier, time_ns) FILTER (WHERE reachable AND compatible) AS near_tier,
           arg_max(holder, time_ns) FILTER (WHERE reachable AND compatible) AS near_holder,
           arg_max(writer, time_ns) FILTER (WHERE reachable AND compatible) AS near_writer,
           max(time_ns) FILTER (WHERE reachable AND compatible) AS near_ns,
           arg_max(tier, time_ns) FILTER (WHERE NOT reachable AND compatible) AS far_tier,
           arg_max(holder, time_ns) FILTER (WHERE NOT reachable AND compatible) AS far_holder,
           arg_max(writer, time_ns) FILTER (WHERE NOT reachable AND compatible) AS far_writer,
           max(time_ns) FILTER (WHERE NOT reachable AND compatible) AS far_ns,
           arg_max(tier, time_ns) AS any_tier,
           arg_max(holder, time_ns) AS any_holder,
           arg_max(writer, time_ns) AS any_writer,
           max(time_ns) AS any_ns
    FROM copies
    GROUP BY replica, request_id, lookup_ns, token_start, kv_group
),
status AS (
    -- Each page with its present copies' verdicts, and whether its key was stored anywhere before the lookup.
    SELECT p.*, coalesce(f.first_seq <= p.at_seq, false) AS stored_before,
           s.near, s.far, s.any_ns, s.source_writer
    FROM prompt p
    LEFT JOIN first_stores f ON f.key = p.key AND f.kv_group = p.kv_group
    LEFT JOIN seen s ON s.replica = p.replica AND s.request_id = p.request_id AND s.lookup_ns = p.lookup_ns
                   AND s.token_start = p.token_start AND s.kv_group = p.kv_group
),
last_stores AS (
    -- The latest store up to the lookup, where a cause is about it: an evicted page (no copy
    -- left), or a used one whose copy is not in the store it came from (another replica's).
    SELECT p.replica, p.request_id, p.lookup_ns, p.token_start, p.kv_group, max(e.time_ns) AS last_ns,
           arg_max(e.replica, e.seq) AS last_writer, arg_max(e.tier, e.seq) AS last_tier,
           arg_max(e.holder, e.seq) AS last_holder
    FROM status p
    JOIN events e ON e.key = p.key AND e.kv_group = p.kv_group AND e.op = 'store' AND e.seq <= p.at_seq
    WHERE p.any_ns IS NULL AND p.stored_before OR (p.used OR p.in_gpu) AND p.source_writer IS NULL
    GROUP BY p.replica, p.request_id, p.lookup_ns, p.token_start, p.kv_group
),
later_stores AS (
    -- Stores after the lookup of pages stored nowhere before it, by requests other than this one.
    SELECT p.replica, p.request_id, p.token_start, p.kv_group, p.lookup_ns, e.time_ns, e.replica AS writer,
           e.request_id AS writer_request, e.tier, e.holder
    FROM status p
    JOIN events e ON e.key = p.key AND e.kv_group = p.kv_group AND e.op = 'store' AND e.seq > p.at_seq
    WHERE NOT p.stored_before AND NOT (e.replica = p.replica AND coalesce(e.request_id, '') = p.request_id)
),
writers AS (
    -- When each of those requests had started (its first lookup, fetch or store).
    SELECT replica, request_id, min(start_ns) AS start_ns
    FROM spans
    WHERE op IN ('lookup', 'fetch', 'store') AND request_id IN (SELECT writer_request FROM later_stores)
    GROUP BY replica, request_id
),
races AS (
    -- The first of those stores by a request already under way at the lookup.
    SELECT l.replica, l.request_id, l.lookup_ns, l.token_start, l.kv_group,
           min(l.time_ns) AS next_ns,
           arg_min(l.tier, l.time_ns) AS next_tier,
           arg_min(l.holder, l.time_ns) AS next_holder,
           arg_min(l.writer, l.time_ns) AS next_writer
    FROM later_stores l
    JOIN writers w ON w.replica = l.writer AND w.request_id = l.writer_request
    WHERE w.start_ns <= l.lookup_ns
    GROUP BY l.replica, l.request_id, l.lookup_ns, l.token_start, l.kv_group
),
decided AS (
    SELECT p.replica, p.request_id, p.lookup_ns, p.prompt_tokens, p.token_start, p.token_end, p.key, p.kv_group,
           p.kv_group_kind, p.in_gpu,
           p.fetched_tier, s.source_tier, s.source_holder, s.source_writer, s.source_ns, l.last_tier, l.last_holder,
           l.last_writer, l.last_ns, s.near_tier, s.near_holder, s.near_writer, s.near_ns, s.far_tier, s.far_holder,
           s.far_writer, s.far_ns, s.any_tier, s.any_holder, s.any_writer, s.any_ns, r.next_tier, r.next_holder,
           r.next_writer, r.next_ns,
           CASE
               WHEN p.in_gpu THEN 'hit_gpu'
               WHEN p.used AND coalesce(p.fetched_tier, '') <> 'remote'
                    AND coalesce(s.source_writer, l.last_writer) = p.replica THEN 'hit_local'
               WHEN p.used THEN 'hit_pool'
               WHEN p.fetched AND p.token_start = min(CASE WHEN p.fetched AND NOT p.used THEN p.token_start END)
                        OVER (PARTITION BY p.replica, p.request_id, p.lookup_ns) THEN 'rejected'
               -- A sliding-window group's page before the window of the lookup: dropped by design.
               WHEN p.kv_group_kind LIKE 'sliding_window%' AND p.token_end <= p.prompt_tokens - p.sliding_window
                   THEN 'outside_window'
               WHEN p.fetched OR s.near THEN 'prefix_broken'
               WHEN s.far THEN 'routed_away'
               WHEN s.any_ns IS NOT NULL THEN 'incompatible_producer'
               WHEN p.stored_before THEN 'evicted'
               WHEN r.next_ns IS NOT NULL THEN 'stored_after_lookup'
               ELSE 'never_stored'
           END AS cause,
           -- Achievable: used, or a compatible copy present anywhere in the fleet at the lookup;
           -- a page dropped by design (outside_window, decided from these same columns) breaks no prefix.
           p.used OR p.in_gpu OR coalesce(s.near, false) OR coalesce(s.far, false)
               OR coalesce(p.kv_group_kind LIKE 'sliding_window%' AND p.token_end <= p.prompt_tokens - p.sliding_window,
                           false) AS available
    FROM status p
    LEFT JOIN seen s ON s.replica = p.replica AND s.request_id = p.request_id AND s.lookup_ns = p.lookup_ns
                   AND s.token_start = p.token_start AND s.kv_group = p.kv_group
    LEFT JOIN last_stores l ON l.replica = p.replica AND l.request_id = p.request_id AND l.lookup_ns = p.lookup_ns
                            AND l.token_start = p.token_start AND l.kv_group = p.kv_group
    LEFT JOIN races r ON r.replica = p.replica AND r.request_id = p.request_id AND r.lookup_ns = p.lookup_ns
                      AND r.token_start = p.token_start AND r.kv_group = p.kv_group
)
SELECT d.request_id, d.replica, d.lookup_ns, d.prompt_tokens,
       row_number() OVER (PARTITION BY d.replica, d.request_id, d.lookup_ns ORDER BY d.kv_group, d.token_start) - 1
           AS page,
       d.token_start, d.token_end, d.key, d.kv_group, d.kv_group_kind, d.cause,
       d.cause <> 'outside_window'
           AND d.token_start < coalesce(min(CASE WHEN NOT d.available THEN d.token_start END)
                                            OVER (PARTITION BY d.replica, d.request_id, d.lookup_ns),
                                        9223372036854775807) AS achievable,
       -- A token range is reused only if every group's page it needs is: a missed page stands for it first.
       row_number() OVER (PARTITION BY d.replica, d.request_id, d.lookup_ns, d.token_start
                          ORDER BY CASE WHEN d.cause = 'outside_window' THEN 2
                                        WHEN d.cause IN ('hit_gpu', 'hit_local', 'hit_pool') THEN 1 ELSE 0 END,
                                   d.kv_group) = 1 AS counted,
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
            WHEN d.cause = 'stored_after_lookup' THEN d.next_ns END AS stored_ns
FROM decided d
ORDER BY d.replica, d.request_id, d.lookup_ns, d.kv_group, d.token_start
