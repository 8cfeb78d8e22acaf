"""The live app over a test fleet's trace files, and the bad fetch the TUI tests plant in it."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from kvaudit.read.store import TraceStore
from kvaudit.tui.app import KvauditApp
from kvaudit.tui.source import LiveSource
from kvaudit.tui.widgets.replica_table import ReplicaTable

from .pages import full_page
from .tui_auditor import Planted, ScriptedAuditor
from .tui_fleet import Fleet

BAD_KEY = "bad0" * 16
PACKED, UNPACKED = "NB_NH_BS_2HS", "NB_2_BS_NH_HS"


def planted_layout_mismatch() -> Planted:
    return Planted(
        key=BAD_KEY,
        code="KVA004",
        rule="store-fetch-mismatch",
        severity="critical",
        fields={"layout": {"fetched": UNPACKED, "stored": PACKED}},
        message="fetched page layout differs from the stored one",
        producer="r1",
    )


def live_app(trace_dir: Path, auditor: ScriptedAuditor | None) -> KvauditApp:
    source = LiveSource(TraceStore([trace_dir], workers=1), auditor=auditor, audit_interval_s=0)
    return KvauditApp(source, watching=str(trace_dir), interval_s=0.25)


def replicas_shown(app: KvauditApp) -> list[str]:
    table = app.query_one(ReplicaTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def plant_bad_fetch(fleet: Fleet) -> None:
    fleet.store("r1", "bad-t1", [BAD_KEY])
    fleet.clock.advance(0.5)
    misread = replace(full_page(BAD_KEY, 0, used=True), layout=UNPACKED)
    fleet.fetch("r2", "bad-t2", [misread], requested_pages=1)
