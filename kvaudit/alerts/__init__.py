"""Alerting over the kvaudit views: Prometheus-shaped rule files whose `expr` is SQL.

- `rules`: the rule file model, loaded from YAML with the line of every node.
- `check`: what `kvaudit alerts check` reports (structure, durations, SQL, templates).
- `evaluate`: one rule's SQL over a backend, in its sandbox, bounded in time and alerts, as labelled samples.
- `engine`: the Prometheus state machine (pending, firing, resolved) with state on disk (`state_file`).
- `rule_health`: each rule's last evaluation, and the `KVAuditRuleFailing` alert of a failing one.
- `notifiers`, `dispatch`: delivery to stdout, files, webhooks and Alertmanager, queued per notifier.
- `watch_metrics`: rule health and deliveries for Prometheus (`kvaudit alerts watch --metrics`).

May import: the analysis stage (the `findings` table), `kvaudit.backends`, the contract.
"""
