"""Alerting over the kvaudit views: Prometheus-shaped rule files whose `expr` is SQL.

- `rules`: the rule file model, loaded from YAML with the line of every node.
- `check`: what `kvaudit alerts check` reports (structure, durations, SQL, templates).
- `evaluate`: one rule's SQL over a backend, as labelled samples.
- `engine`: the Prometheus state machine (pending, firing, resolved) with state on disk.
- `notifiers`, `dispatch`: delivery to stdout, files, webhooks and Alertmanager.

May import: the analysis stage (the `findings` table), `kvaudit.backends`, the contract.
"""
