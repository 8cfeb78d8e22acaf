"""Where the receiver writes what it accepts: one OTLP JSON lines file per replica."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, TracesData

from kvaudit.contract import Res
from kvaudit.emit.file_exporter import DEFAULT_MAX_BYTES
from kvaudit.emit.line_file import LineFile
from kvaudit.otlp.encode import proto_to_line

UNKNOWN_REPLICA: Final = "unknown"


@dataclass
class CollectorStats:
    requests: int = 0
    spans: int = 0
    rejected: int = 0


class TraceSink:
    """Writes received trace data to `DIR/<replica>.jsonl`, one rotating file per replica.

    Args:
        directory: where the files go (created if missing).
        max_bytes: rotation size of each file.
        fsync: fsync each write before the request is acknowledged.
    """

    def __init__(self, directory: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        self._fsync = fsync
        self._files: dict[str, LineFile] = {}
        self._lock = threading.Lock()
        self.stats = CollectorStats()

    def write(self, data: TracesData | ExportTraceServiceRequest) -> int:
        """Write each replica's resource spans as one line in its file; returns spans written."""
        by_replica: dict[str, list[ResourceSpans]] = {}
        spans = 0
        for resource_spans in data.resource_spans:
            by_replica.setdefault(_replica_of(resource_spans), []).append(resource_spans)
            spans += sum(len(scope.spans) for scope in resource_spans.scope_spans)
        for replica, group in by_replica.items():
            self._file(replica).write(proto_to_line(TracesData(resource_spans=group)))
        with self._lock:
            self.stats.requests += 1
            self.stats.spans += spans
        return spans

    def _file(self, replica: str) -> LineFile:
        with self._lock:
            line_file = self._files.get(replica)
            if line_file is None:
                safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in replica) or UNKNOWN_REPLICA
                line_file = LineFile(self.directory / f"{safe}.jsonl", max_bytes=self._max_bytes, fsync=self._fsync)
                self._files[replica] = line_file
            return line_file

    def close(self) -> None:
        with self._lock:
            for line_file in self._files.values():
                line_file.close()
            self._files.clear()


def _replica_of(resource_spans: ResourceSpans) -> str:
    for kv in resource_spans.resource.attributes:
        if kv.key == Res.REPLICA:
            return kv.value.string_value or UNKNOWN_REPLICA
    return UNKNOWN_REPLICA
