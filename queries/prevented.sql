-- prevented: the pages prevention kept from replicas of another geometry, in one row.
--
-- Question: how much reuse did prevention forgo (docs/design.md section 4.5)? A prevented
--           key carries its replica's geometry fingerprint as its tag
--           (`...@kvaudit_geometry%<fingerprint>`; in multiprocess mode the cache salt's,
--           `<chunk hash>@<client salt>+kvaudit_geometry%<fingerprint>`), so replicas of other geometries make
--           other keys for the same tokens. For each page of tokens, every geometry beyond
--           the first whose tagged key stored it is a replica that recomputed what the pool
--           held for another geometry: reuse that was unsafe anyway. Counted from stores
--           (LMCache's lookups name no pages): a replica that recomputes a page without
--           storing it is not counted, nor a key without the tag.
-- Parameters: none.
-- Columns: prevented_pages.
SELECT count(*) - count(DISTINCT tokens_key) AS prevented_pages
FROM (
    -- One row per page of tokens (its key without the tag) and geometry (the tag).
    SELECT DISTINCT regexp_replace(key, '[@+]kvaudit_geometry%[0-9a-f]+', '') AS tokens_key,
           regexp_extract(key, '[@+]kvaudit_geometry%([0-9a-f]+)', 1) AS geometry
    FROM pages
    WHERE op = 'store' AND contains(key, 'kvaudit_geometry%')
) tagged;
