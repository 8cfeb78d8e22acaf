-- prefix_locality: how much of each request's prompt was already in the pool.
--
-- Question: per request, how many leading prompt tokens could have been reused (their
--           pages were stored by another request before this one began, allowing clock
--           skew), against its prompt length, and how that ratio is distributed. It is
--           the ceiling the pool could reach with perfect routing and unlimited capacity;
--           hit_tokens is what the request actually fetched and used.
-- Parameters: kvaudit_skew_s (DOUBLE, default 1.0): allowed clock skew in seconds.
-- Columns: request_id, replica (the first replica that served it), prompt_tokens
--          (largest tokens_requested of its lookups and fetches, else its pages' end),
--          reusable_tokens (tokens from the start up to the first page nobody else had
--          stored), hit_tokens, locality (reusable_tokens / prompt_tokens),
--          cumulative_share (share of requests whose locality is at most this one's:
--          the distribution).
WITH first_store AS (
    SELECT key, arg_min(request_id, time_ns) AS request_id, min(time_ns) AS stored_ns
    FROM pages
    WHERE op = 'store' AND key IS NOT NULL
    GROUP BY key
),
requests AS (
    SELECT request_id, arg_min(replica, start_ns) AS replica, min(start_ns) AS start_ns,
           max(CASE WHEN op IN ('lookup', 'fetch') THEN tokens_requested END) AS requested
    FROM spans
    WHERE request_id IS NOT NULL AND op IS NOT NULL
    GROUP BY request_id
),
request_pages AS (
    SELECT p.request_id, p.op, p.used, p.token_start, p.token_end,
           s.request_id IS NOT NULL AND s.request_id <> p.request_id
             AND s.stored_ns <= r.start_ns + CAST(coalesce(getvariable('kvaudit_skew_s'), 1.0) * 1e9 AS BIGINT)
             AS available
    FROM pages p
    LEFT JOIN first_store s ON s.key = p.key
    -- LEFT, though only pages of known requests count (per_request keeps those): an inner
    -- join here lets the planner misjudge its size and hash every page instead of the
    -- stored keys, several times slower. Pages are joined to their request once, here.
    LEFT JOIN requests r ON r.request_id = p.request_id
    WHERE p.op IN ('store', 'fetch') AND p.request_id IS NOT NULL
      AND p.token_start IS NOT NULL AND p.token_end IS NOT NULL
),
page_totals AS (
    SELECT request_id,
           max(token_end) AS pages_end,
           min(token_start) FILTER (WHERE NOT available) AS first_unavailable,
           sum(token_end - token_start) FILTER (WHERE op = 'fetch' AND used IS NOT false) AS hit_tokens
    FROM request_pages
    GROUP BY request_id
),
per_request AS (
    SELECT r.request_id, r.replica,
           coalesce(r.requested, t.pages_end, 0) AS prompt_tokens,
           coalesce(t.first_unavailable, t.pages_end, 0) AS reusable_tokens,
           coalesce(t.hit_tokens, 0) AS hit_tokens
    FROM requests r
    LEFT JOIN page_totals t ON t.request_id = r.request_id
)
SELECT request_id, replica, prompt_tokens, reusable_tokens, hit_tokens,
       CAST(reusable_tokens AS DOUBLE) / nullif(prompt_tokens, 0) AS locality,
       cume_dist() OVER (ORDER BY CAST(reusable_tokens AS DOUBLE) / nullif(prompt_tokens, 0)) AS cumulative_share
FROM per_request
ORDER BY locality, request_id;
