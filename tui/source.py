"""The live side of the TUI: one backend, read as it grows, audited and alerted on.

Every call here queries the backend and may take a while, so the app only calls it
from worker threads; a lock keeps the backend to one thread at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from kvaudit.analyse.explain import Explanation, explain
from kvaudit.backends import Source, as_backend
from kvaudit.read.columns import Tables
from kvaudit.tui.alerting import Alerting
from kvaudit.tui.descriptors import DescriptorPair, descriptor_pair
from kvaudit.tui.figures import PREVENTED, Analysis, Figures, compute_figures
from kvaudit.tui.findings import Auditor, FindingRow, finding_rows
from kvaudit.tui.producers import ProducerIndex
from kvaudit.tui.reuse_left import LostRequest, lost_requests
from kvaudit.tui.window import Window

NO_AUDITOR: Final = "not audited: the auditor is off"
AUDITING: Final = "auditing…"
NO_ALERTING: Final = "no alert rules"
EVALUATING: Final = "evaluating the rules…"


class LiveSource:
    """Traces being written, turned into `Figures` on demand.

    Until the first audit and the first evaluation of the rules finish, the findings and
    alerts are unknown (None, with a note saying they are on their way), never an empty
    list that would read as "all clear".

    Args:
        source: the traces (trace files are read incrementally by `poll`): a backend, or a
            DuckDB store.
        auditor: keeps the findings (`kvaudit.analyse.live_audit.LiveAudit`, which the alerting
            engine may share); None shows that there is no auditor.
        alerting: evaluates the alert rules; None shows that there are none.
        alerts_source: what the rules are (a file, the default pack), for the alerts panel.
        skew_s: clock skew allowed between replicas when joining fetches to stores.
        audit_interval_s: the least time between two audits (each audits what arrived since
            the last), and between two evaluations of the rules when no audit brings news.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        source: Source,
        *,
        auditor: Auditor | None,
        alerting: Alerting | None = None,
        alerts_source: str = "",
        skew_s: float = 1.0,
        audit_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend = as_backend(source)
        self._auditor = auditor
        self._alerting = alerting
        self._skew_s = skew_s
        self._audit_interval_s = audit_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._analysing = threading.Lock()  # held by `analyse`, which reads through the audit connection
        self._closed = False
        # The auditor and the rules read through a connection of their own to the same data,
        # so a long audit runs beside the refreshes instead of holding them up.
        self._audit_backend = backend.cursor()
        self._analysis = Analysis(
            findings=None,
            findings_note=NO_AUDITOR if auditor is None else AUDITING,
            findings_pending=auditor is not None,
            alerts=None,
            alerts_note=NO_ALERTING if alerting is None else EVALUATING,
            alerts_source=alerts_source,
        )
        self._producers = ProducerIndex.of(backend, skew_s=skew_s)
        self._read = False  # a poll has finished: an audit now sees what the traces hold
        self._rows = 0
        self._audited_rows: int | None = None  # rows read when the findings were computed
        self._next_audit = 0.0
        self._next_alerting = 0.0
        self._prevented_rows: int | None = None  # rows read when the prevented pages were counted
        self._next_prevented = 0.0
        self._last: Figures | None = None  # the latest figures computed
        self._serial = 0  # of the latest figures computed (Figures.serial)

    def poll(self, window: Window, *, final: bool = False) -> Figures:
        """Read what was appended to the traces and compute the figures over `window`.

        Args:
            final: also read an unterminated last line (a one-shot read, not a live one).
        """
        with self._lock:
            if not self.backend.follows_files:  # a backend that reads nothing itself: its queries see the newest data
                self._rows += 1  # (so each poll may bring news for the auditor)
                self._read = True
                return self._figures(window)
            arrived = _Arrived(self._producers)
            self.backend.refresh(final=final, added=arrived.add)
            if arrived.rows == 0 and self._last is not None and self._last.window == window.name:
                return self._last  # nothing new: the same figures, without asking the backend again
            self._rows += arrived.rows
            self._read = True
            return self._figures(window)

    def audit_due(self) -> bool:
        """An audit would run now: the traces were read, changed since the last audit, and the interval passed."""
        return (
            self._auditor is not None
            and self._read
            and self._rows != self._audited_rows
            and self._clock() >= self._next_audit
        )

    def analyse(self, window: Window, *, force: bool = False) -> Figures | None:
        """Audit (when due) and evaluate the alert rules (after an audit, else once per interval).

        Call it from one thread at a time; `poll` may run meanwhile.

        Returns:
            The figures with what changed, or None when nothing did.
        """
        with self._analysing:
            if self._closed:
                return None
            findings = None
            if self._auditor is not None and (force or self.audit_due()):
                self._audited_rows = self._rows
                # The alert rules bring the same findings up to date too: an update that found them
                # current may still be the first to show them.
                updated = self._auditor.update(self._audit_backend)
                if updated or force or self._analysis.findings is None:
                    findings = finding_rows(self._auditor.findings(self._audit_backend))
                self._next_audit = self._clock() + self._audit_interval_s
            alerts = None
            if self._alerting is not None and (force or findings is not None or self._clock() >= self._next_alerting):
                alerts = self._alerting(self._audit_backend)
                self._next_alerting = self._clock() + self._audit_interval_s
            prevented = None
            if self._read and (force or (self._rows != self._prevented_rows and self._clock() >= self._next_prevented)):
                self._prevented_rows = self._rows
                [(prevented,)] = self._audit_backend.query(PREVENTED)[1]
                self._next_prevented = self._clock() + self._audit_interval_s
            with self._lock:
                analysis = self._analysis
                if findings is not None:
                    analysis = replace(analysis, findings=findings, findings_note="", findings_pending=False)
                if alerts is not None:
                    analysis = replace(analysis, alerts=alerts, alerts_note="")
                if prevented is not None:
                    analysis = replace(analysis, prevented_pages=int(prevented))
                if analysis == self._analysis:
                    return None
                self._analysis = analysis
                return self._figures(window)

    def figures(self, window: Window) -> Figures:
        """The figures over `window` without reading anything new (a window change)."""
        with self._lock:
            return self._figures(window)

    def descriptors(self, finding: FindingRow) -> DescriptorPair:
        """The fetched and stored descriptors behind a finding."""
        with self._lock:
            return descriptor_pair(self.backend, finding, skew_s=self._skew_s)

    def lost_requests(self, replica: str, since_ns: int | None) -> list[LostRequest]:
        """The requests of `replica` looked up from `since_ns` on that left the most reuse on the table."""
        with self._lock:
            return lost_requests(self.backend, replica, since_ns)

    def explanation(self, replica: str, request_id: str, lookup_ns: int | None = None) -> Explanation | None:
        """`kvaudit explain` of one request on `replica`: the one looked up at `lookup_ns` where
        given (an id may name several requests), else the first (None: no such request in the traces)."""
        with self._lock:
            found = explain(self.backend, request_id, replica=replica)
        chosen = [request for request in found if lookup_ns is None or request.lookup_ns == lookup_ns]
        return chosen[0] if chosen else None

    def close(self) -> None:
        """Stop an audit in flight (it would hold the connections open), then close both connections."""
        self._closed = True
        self._audit_backend.interrupt()
        with self._analysing, self._lock:
            if self._audit_backend is not self.backend:
                self._audit_backend.close()
            self.backend.close()

    def _figures(self, window: Window) -> Figures:
        self._serial += 1
        figures = compute_figures(
            self.backend, window, analysis=self._analysis, indexed=self._producers is not None, skew_s=self._skew_s
        )
        self._last = replace(figures, serial=self._serial)
        return self._last


@dataclass
class _Arrived:
    """One read's rows, each part's pages added to the producer index as it is taken in, and counted."""

    producers: ProducerIndex | None
    rows: int = 0  # spans and unreadable lines

    def add(self, tables: Tables) -> None:
        if self.producers is not None:
            self.producers.add(tables.pages)
        self.rows += tables.spans.num_rows + tables.errors.num_rows


def snapshot(source: LiveSource, window: Window) -> dict[str, Any]:
    """Everything read once, audited once: the figures as JSON-ready values."""
    figures = source.poll(window, final=True)
    return (source.analyse(window, force=True) or figures).as_json()
