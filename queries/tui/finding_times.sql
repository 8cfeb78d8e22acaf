-- tui/finding_times: when each finding's span ended (the findings panel keeps those in its window).
--
-- Question: which of the auditor's findings fall in the window the TUI shows?
-- Reads: tui_finding_spans (trace_id, span_id of the findings), which the TUI registers.
-- Parameters: none.
-- Columns: trace_id, span_id, end_ns (the span's end, as the window tests it).
SELECT f.trace_id, f.span_id, max(s.end_ns) AS end_ns
FROM tui_finding_spans f
JOIN spans s ON s.trace_id = f.trace_id AND s.span_id = f.span_id
GROUP BY f.trace_id, f.span_id;
