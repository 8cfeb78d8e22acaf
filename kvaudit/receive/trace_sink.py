"""Where the receiver writes what it accepts: one OTLP JSON lines file per replica.

A request is written whole or not at all, across all the replicas it carries, so that
answering a failure as retryable never makes a retry duplicate what was written (and a
failed request leaves no empty file it created). A resource whose replica id cannot name
a file, and a span or resource no reader could read (`readable`), are data errors of that
part of the request: they are rejected by name and counted, and the rest is written (OTLP
partial success). Open files are bounded: the least recently used is closed, and opened
again when its replica sends more; a request naming more replicas than that bound is
rejected whole, as it could never be written.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, TracesData

from kvaudit.contract import Res
from kvaudit.emit.file_exporter import DEFAULT_MAX_BYTES
from kvaudit.emit.line_file import LineFile, write_together
from kvaudit.otlp.encode import resource_spans_to_line
from kvaudit.otlp.limits import MAX_LINE_BYTES
from kvaudit.receive.readable import describe, resource_problem, span_problem

UNKNOWN_REPLICA: Final = "unknown"
# A replica id names its file: with a rotation stamp, `.jsonl` and a pid it must stay
# within the 255 bytes most file systems allow a name.
MAX_REPLICA_BYTES: Final = 200
DEFAULT_MAX_OPEN_FILES: Final = 256
_NAMED_PROBLEMS: Final = 10  # rejections named in one answer; the rest are counted


@dataclass
class CollectorStats:
    """What the receiver did, cumulative; `add` is safe from any thread."""

    requests: int = 0  # requests written (wholly or in part)
    spans: int = 0  # spans written
    rejected: int = 0  # requests refused for what they are (4xx)
    rejected_spans: int = 0  # spans refused as data errors (partial success or 400)
    refused: int = 0  # requests refused for now (503: memory budget, connections, no space)
    write_failures: int = 0  # writes that failed and were cut back (503)
    timeouts: int = 0  # connections closed for being too slow
    unauthorized: int = 0  # requests without the bearer token (401)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)

    def summary(self) -> str:
        return ", ".join(f"{getattr(self, f.name)} {f.name.replace('_', ' ')}" for f in fields(self))


@dataclass(frozen=True)
class WriteResult:
    spans: int  # written
    rejected_spans: int = 0
    message: str = ""  # why spans were rejected


class TraceSink:
    """Writes received trace data to `DIR/<replica>.jsonl`, one rotating file per replica.

    Args:
        directory: where the files go (created if missing).
        max_bytes: rotation size of each file.
        fsync: fsync each write before the request is acknowledged.
        max_open_files: descriptors kept open at most (least recently used closed first;
            one more per request in flight when every open file is being written).

    Raises:
        OSError: the directory cannot be created.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fsync: bool = True,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        self._fsync = fsync
        self._max_open = max(1, max_open_files)
        self._files: OrderedDict[str, LineFile] = OrderedDict()  # least recently used first
        self._users: dict[str, int] = {}
        self._lost_in_closed = 0
        self._lock = threading.Lock()
        self.stats = CollectorStats()

    @property
    def open_files(self) -> int:
        with self._lock:
            return sum(line_file.is_open for line_file in self._files.values())

    @property
    def lost_spans(self) -> int:
        """Spans written into files that were deleted under the receiver afterwards."""
        with self._lock:
            return self._lost_in_closed + sum(f.stats.lost_items for f in self._files.values())

    def write(self, data: TracesData | ExportTraceServiceRequest) -> WriteResult:
        """Write each replica's resource spans as one line in its file, all or nothing.

        Raises:
            OSError: nothing of the request was written (the files are as they were).
        """
        groups: dict[str, tuple[list[ResourceSpans], list[int]]] = {}
        rejected = 0
        problems: list[str] = []
        for resource_spans in data.resource_spans:
            replica = _replica_of(resource_spans)
            problem = _replica_problem(replica) or resource_problem(resource_spans)
            if problem:
                rejected += sum(len(scope.spans) for scope in resource_spans.scope_spans)
                problems.append(problem)
                continue
            for scope_spans in resource_spans.scope_spans:
                spans = scope_spans.spans
                for index in reversed(range(len(spans))):
                    problem = span_problem(spans[index])
                    if problem:
                        problems.append(f"{describe(spans[index])}: {problem}")
                        rejected += 1
                        del spans[index]
            count = sum(len(scope.spans) for scope in resource_spans.scope_spans)
            if count:
                group, counts = groups.setdefault(_file_name(replica), ([], []))
                group.append(resource_spans)
                counts.append(count)
        if len(groups) > self._max_open:
            rejected += sum(sum(counts) for _, counts in groups.values())
            problems = [
                f"the request names {len(groups)} replicas, more than the {self._max_open} files the"
                " receiver keeps open (--max-open-files): send fewer replicas per request"
            ]
            groups = {}
        lines = []
        for name, (group, counts) in groups.items():
            line = resource_spans_to_line(group)
            if len(line) > MAX_LINE_BYTES:
                rejected += sum(counts)
                problems.append(f"{name}: a line of {len(line)} bytes, longer than the readers' limit {MAX_LINE_BYTES}")
                continue
            lines.append((name, line, sum(counts)))
        written = sum(count for _, _, count in lines)
        if lines:
            self._write_lines(lines)
            self.stats.add(requests=1, spans=written, rejected_spans=rejected)
        elif rejected:
            self.stats.add(rejected_spans=rejected)
        return WriteResult(written, rejected, _rejection(rejected, problems))

    def _write_lines(self, lines: Sequence[tuple[str, bytes | bytearray, int]]) -> None:
        names = [name for name, _, _ in lines]
        files, created = self._acquire(names)
        try:
            if len(lines) == 1:
                files[0].write(lines[0][1], items=lines[0][2])
            else:
                write_together([(f, line, count) for f, (_, line, count) in zip(files, lines)], fsync=self._fsync)
        except OSError:
            self._let_go(names, remove_empty=created)
            raise
        self._let_go(names)

    def _acquire(self, names: Sequence[str]) -> tuple[list[LineFile], set[str]]:
        """The files of `names`, held for writing, and the names whose files were made for this request."""
        with self._lock:
            files = []
            created = set()
            for name in names:
                line_file = self._files.get(name)
                if line_file is None:
                    path = self.directory / f"{name}.jsonl"
                    if not path.exists():
                        created.add(name)
                    line_file = LineFile(path, max_bytes=self._max_bytes, fsync=self._fsync)
                    self._files[name] = line_file
                self._files.move_to_end(name)
                self._users[name] = self._users.get(name, 0) + 1
                files.append(line_file)
            self._close_least_recent()
            return files, created

    def _let_go(self, names: Sequence[str], remove_empty: set[str] | frozenset[str] = frozenset()) -> None:
        """Done writing `names`; the files of `remove_empty` that nobody else is writing are removed if empty."""
        with self._lock:
            for name in names:
                self._users[name] -= 1
                if not self._users[name]:
                    del self._users[name]
                    if name in remove_empty:
                        self._remove_if_empty(name)
            self._close_least_recent()

    def _remove_if_empty(self, name: str) -> None:
        line_file = self._files.pop(name)
        with line_file.lock:
            empty = line_file.size_locked == 0
        line_file.release()
        if empty:
            line_file.path.unlink(missing_ok=True)

    def _close_least_recent(self) -> None:
        """Close files beyond the bound, oldest first, skipping those being written."""
        excess = len(self._files) - self._max_open
        for name in list(self._files):
            if excess <= 0:
                return
            if name in self._users:
                continue
            line_file = self._files.pop(name)
            line_file.release()
            self._lost_in_closed += line_file.stats.lost_items
            excess -= 1

    def close(self) -> None:
        with self._lock:
            for line_file in self._files.values():
                line_file.close()
                self._lost_in_closed += line_file.stats.lost_items
            self._files.clear()


def _rejection(rejected: int, problems: list[str]) -> str:
    if not rejected:
        return ""
    problems = list(dict.fromkeys(problems))  # one replica's problem, once however many resources had it
    named = problems[:_NAMED_PROBLEMS]
    more = f"; and {len(problems) - len(named)} more" if len(problems) > len(named) else ""
    return f"{rejected} spans rejected: {'; '.join(named)}{more}"


def _replica_of(resource_spans: ResourceSpans) -> str:
    for kv in resource_spans.resource.attributes:
        if kv.key == Res.REPLICA:
            return kv.value.string_value or UNKNOWN_REPLICA
    return UNKNOWN_REPLICA


def _replica_problem(replica: str) -> str:
    if len(replica.encode(errors="surrogatepass")) > MAX_REPLICA_BYTES:
        return f"{Res.REPLICA} longer than {MAX_REPLICA_BYTES} bytes"
    return ""


def _file_name(replica: str) -> str:
    """The replica id as a file name in the sink's directory: letters, digits, `-_.`; nothing climbs out."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in replica) or UNKNOWN_REPLICA
