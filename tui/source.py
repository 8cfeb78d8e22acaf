"""The live side of the TUI: one backend, read as it grows, audited and alerted on.

Every call here queries the backend and may take a while, so the app only calls it
from worker threads; a lock keeps the backend to one thread at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from kvaudit.backends import Source, as_backend
from kvaudit.tui.alerting import Alerting
from kvaudit.tui.descriptors import DescriptorPair, descriptor_pair
from kvaudit.tui.figures import Analysis, Figures, compute_figures
from kvaudit.tui.findings import Auditor, FindingRow, finding_rows
from kvaudit.tui.producers import ProducerIndex
from kvaudit.tui.window import Window

NO_AUDITOR: Final = "not audited: the auditor is off"
NO_RULES: Final = "no rule file (--rules)"


class LiveSource:
    """Traces being written, turned into `Figures` on demand.

    Args:
        source: the traces (trace files are read incrementally by `poll`): a backend, or a
            DuckDB store.
        auditor: computes findings; None shows that there is no auditor.
        alerting: evaluates the rule file; None with `alerts_note` saying why there is none.
        skew_s: clock skew allowed between replicas when joining fetches to stores.
        audit_interval_s: the least time between two audits (an audit reads everything).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        source: Source,
        *,
        auditor: Auditor | None,
        alerting: Alerting | None = None,
        alerts_note: str = NO_RULES,
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
        # The auditor reads through a connection of its own to the same data, so a long
        # audit runs beside the refreshes instead of holding them up.
        self._audit_backend = backend.cursor()
        self._analysis = Analysis(
            findings=None if auditor is None else (),
            findings_note="" if auditor is not None else NO_AUDITOR,
            alerts=None if alerting is None else (),
            alerts_note="" if alerting is not None else alerts_note,
        )
        self._producers = ProducerIndex.of(backend, skew_s=skew_s)
        self._rows = 0
        self._audited_rows = -1  # rows read when the findings were computed
        self._next_audit = 0.0
        self._last: Figures | None = None  # the latest figures computed
        self._serial = 0  # of the latest figures computed (Figures.serial)

    def poll(self, window: Window, *, final: bool = False) -> Figures:
        """Read what was appended to the traces and compute the figures over `window`.

        Args:
            final: also read an unterminated last line (a one-shot read, not a live one).
        """
        with self._lock:
            tables = self.backend.refresh(final=final)
            if tables is None:  # a backend that reads nothing itself: its queries see the newest data
                self._rows += 1  # (so each poll may bring news for the auditor)
                return self._figures(window)
            added = tables.spans.num_rows + tables.errors.num_rows
            if added == 0 and self._last is not None and self._last.window == window.name:
                return self._last  # nothing new: the same figures, without asking the backend again
            if self._producers is not None:
                self._producers.add(tables.pages)
            self._rows += added
            return self._figures(window)

    def analyse(self, window: Window, *, force: bool = False) -> Figures | None:
        """Audit (when new rows arrived and the interval passed) and evaluate the alert rules.

        Call it from one thread at a time; `poll` may run meanwhile.

        Returns:
            The figures with what changed, or None when nothing did.
        """
        findings = None
        if self._auditor is not None and (force or self._audit_due()):
            self._audited_rows = self._rows
            findings = finding_rows(self._auditor(self._audit_backend))
            self._next_audit = self._clock() + self._audit_interval_s
        with self._lock:
            analysis = self._analysis if findings is None else replace(self._analysis, findings=findings)
            if self._alerting is not None:
                analysis = replace(analysis, alerts=self._alerting(self.backend))
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

    def close(self) -> None:
        with self._lock:
            if self._audit_backend is not self.backend:
                self._audit_backend.close()
            self.backend.close()

    def _audit_due(self) -> bool:
        return self._rows != self._audited_rows and self._clock() >= self._next_audit

    def _figures(self, window: Window) -> Figures:
        self._serial += 1
        figures = compute_figures(
            self.backend, window, analysis=self._analysis, indexed=self._producers is not None, skew_s=self._skew_s
        )
        self._last = replace(figures, serial=self._serial)
        return self._last


def snapshot(source: LiveSource, window: Window) -> dict[str, Any]:
    """Everything read once, audited once: the figures as JSON-ready values."""
    figures = source.poll(window, final=True)
    return (source.analyse(window, force=True) or figures).as_json()
