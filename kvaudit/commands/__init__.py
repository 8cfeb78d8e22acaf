"""One module per `kvaudit` subcommand, and `arguments`, what they share.

`SUMMARIES` names the commands, in the order `kvaudit --help` lists them, with the line
it shows for each: the top-level help needs no command module, and `kvaudit CMD` imports
only `kvaudit.commands.CMD` (`kvaudit.cli`). The one stage that may import every other
(never `kvaudit.cli`, which imports it).
"""

from __future__ import annotations

from typing import Final

from kvaudit.causes import Cause

SUMMARIES: Final[dict[str, str]] = {
    "sql": "Run SQL over the spans, pages, replicas and read_errors views of trace files.",
    "queries": "List the named queries (run one with `kvaudit sql PATHS -q NAME`), with their parameters and defaults.",
    "audit": (
        "Check fetched KV pages against the trace contract and their producers (rules KVA001-KVA008). "
        "Exit status: 0 nothing at warning or above, 1 warnings or critical findings, 2 unusable input."
    ),
    "explain": (
        "Why a request missed: every page of its prompt, in order, with what became of it and why "
        f"({', '.join(Cause)}: docs/design.md section 7), and the reuse it could have had."
    ),
    "report": (
        "The whole picture of traces: audit findings, reuse, hit rates, the reuse left on the table, "
        "transfer overhead and pool capacity. "
        "Exit status as for `kvaudit audit`."
    ),
    "ingest": (
        "Read trace files once into a DuckDB database or a Parquet dataset (columnar), with the kvaudit views on top."
    ),
    "clickhouse": "Manage what kvaudit keeps in ClickHouse beside the OpenTelemetry Collector's otel_traces.",
    "collect": "Receive OTLP/HTTP traces (POST /v1/traces) and write one OTLP JSON lines file per replica.",
    "demo": "Simulate two 27B replicas sharing a 256 GiB KV pool through a rolling upgrade, then audit the traces.",
    "simulate": "Simulate replicas of a model sharing a KV pool; write their traces and the injected faults.",
    "tui": "Watch trace files (or what an in-process receiver gets) live: reuse, transfer, findings, alerts.",
    "alerts": "Alerting rules over the kvaudit views: check rule files, evaluate them, watch traces and notify.",
    "exporter": "Serve hit rates, cross-replica reuse, fetch bytes and latency from trace files on /metrics.",
    "doctor": "Check this environment: engines and hooks, the vLLM plugin, export settings, the page scanner.",
}
