"""A fleet simulator that drives kvaudit's real emission path at 27B-70B scale.

N replicas serve synthetic workloads through a shared KV pool; every lookup, fetch,
store and eviction goes through `kvaudit.emit` into OTLP JSON files, stamped in
simulated time. Modules: `model` (geometry and cost model), `hardware` (GPU
profiles), `specs` (a preset or a JSON file), `workload` (sessions and their token
streams), `router`, `pool` (LRU tiers), `faults` (injection, guard, ground truth),
`page_truth` (every page's cause, docs/design.md section 7), `records` (the truth
files), `engine` (the event loop), `stats` (what a run measured).

May import: the contract and `kvaudit.emit` (it is a serving side, simulated).
"""
