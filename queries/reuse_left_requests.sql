-- reuse_left_requests: per request, the prefix it used against the longest one the fleet held at its lookup, most left on the table first.
-- Includes: explain AS explain_pages
--
-- Question: which requests lost the most reuse, and to what? For every request
--   (queries/explain.sql, read here as `explain_pages`; one request id on one replica names
--   one request per lookup that followed its fetches or stores, docs/design.md section 7.1), its hit tokens beside its
--   achievable ones (docs/design.md section 7.3), and the tokens of its missed pages per
--   cause (section 7.2). `kvaudit explain` takes it from there, one request at a time;
--   `reuse_left` sums it per replica and time bucket.
-- Parameters: explain's (kvaudit_request_id, kvaudit_replica, kvaudit_trace_id, kvaudit_since_ns:
--   unset, every request).
-- Columns: replica, request_id, lookup_ns, prompt_tokens, hit_tokens, achievable_tokens,
--   lost_tokens (achievable - hit), and the tokens of the missed pages per cause: rejected,
--   prefix_broken, routed_away, incompatible_producer, evicted, stored_after_lookup,
--   never_stored.
SELECT replica, request_id, lookup_ns,
       max(prompt_tokens) AS prompt_tokens,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause IN ('hit_gpu', 'hit_local', 'hit_pool')), 0)
           AS hit_tokens,
       coalesce(sum(token_end - token_start) FILTER (WHERE achievable), 0) AS achievable_tokens,
       coalesce(sum(token_end - token_start) FILTER (WHERE achievable), 0)
           - coalesce(sum(token_end - token_start) FILTER (WHERE cause IN ('hit_gpu', 'hit_local', 'hit_pool')), 0)
           AS lost_tokens,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'rejected'), 0) AS rejected,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'prefix_broken'), 0) AS prefix_broken,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'routed_away'), 0) AS routed_away,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'incompatible_producer'), 0)
           AS incompatible_producer,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'evicted'), 0) AS evicted,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'stored_after_lookup'), 0) AS stored_after_lookup,
       coalesce(sum(token_end - token_start) FILTER (WHERE cause = 'never_stored'), 0) AS never_stored
FROM explain_pages
-- One page per token range: a hybrid model's groups each hold one (explain's `counted`).
WHERE counted
GROUP BY replica, request_id, lookup_ns
ORDER BY lost_tokens DESC, replica, request_id, lookup_ns
