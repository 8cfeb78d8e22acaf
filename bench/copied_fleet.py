"""Trace files of a simulated fleet's size, for the benchmarks that read raw traces (`store`, `exporter`).

One fleet is simulated (four replicas over a shared pool, random routing), and its files
are copied until they hold the page rows asked for: each copy with trace ids, request ids
and page keys of its own, so a span is never read twice and every copy's requests explain
as the run's did. Copies are written as the files a fleet's replicas write, one per replica.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.common import smoke
from kvaudit.read.open import open_store
from kvaudit.simulator.engine import GIB, SimConfig, simulate

FLEET: Final = SimConfig(replicas=4, pool_bytes=64 * GIB, local_bytes=32 * GIB, router="random", rate=0.5)
SIM_SECONDS: Final = 20 if smoke() else 120
_TRACE_ID: Final = re.compile(rb'"traceId":"[0-9a-f]{4}')
_NAMED: Final = re.compile(rb'("kvaudit\.(?:request\.id|page\.key)","value":\{"stringValue":")([^"]*)"')


@dataclass(frozen=True)
class CopiedFleet:
    traces: Path  # the directory of the copied files
    base_files: list[Path]  # the simulated run's own files
    copies: int
    rows: int  # page rows in `traces`
    request: str  # a request of the middle copy that fetched

    def copy_of(self, path: Path, copy: int) -> bytes:
        """A file of the run as copy number `copy` writes it (a copy past the last: lines to append)."""
        return _copy(path.read_bytes(), copy)


def copied_fleet(directory: Path, pages: int) -> CopiedFleet:
    """Trace files of about `pages` page rows in `directory`/traces."""
    base = simulate(dataclasses.replace(FLEET, duration_s=SIM_SECONDS), directory / "sim")
    store = open_store([str(f) for f in base.files])
    [(base_pages,)] = store.query("SELECT count(*) FROM pages")[1]
    [(request,)] = store.query("SELECT request_id FROM pages WHERE op = 'fetch' ORDER BY time_ns LIMIT 1")[1]
    store.close()
    copies = max(1, round(pages / base_pages))
    traces = directory / "traces"
    traces.mkdir()
    for path in base.files:
        text = path.read_bytes()
        with (traces / path.name).open("wb") as out:
            for copy in range(copies):
                out.write(_copy(text, copy))
    middle = f"{request}.{copies // 2}" if copies > 1 else request
    return CopiedFleet(traces, list(base.files), copies, copies * base_pages, middle)


def _copy(text: bytes, copy: int) -> bytes:
    """The run's lines as another copy's: its own trace ids, request ids and page keys."""
    if not copy:
        return text
    text = _TRACE_ID.sub(b'"traceId":"' + f"{copy:04x}".encode(), text)
    return _NAMED.sub(lambda m: m.group(1) + m.group(2) + f".{copy}".encode() + b'"', text)
