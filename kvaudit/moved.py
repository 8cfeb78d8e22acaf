"""Import paths of kvaudit 0.1 that moved when the package was laid out by stage (kvaudit 0.2).

`from kvaudit.emission import setup_emitter` and the like keep working, with a
DeprecationWarning naming the new path; they will be removed in kvaudit 0.3. The old
name is a thin module that reads every attribute from the new ones (in order: a module
that was split names each of its parts).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Final

MOVED: Final[dict[str, str | tuple[str, ...]]] = {
    "kvaudit.emission": "kvaudit.emit.emitter",
    "kvaudit.span_batcher": "kvaudit.emit.span_batcher",
    "kvaudit.file_exporter": "kvaudit.emit.file_exporter",
    "kvaudit.line_file": "kvaudit.emit.line_file",
    "kvaudit.otlp_json": "kvaudit.otlp.encode",
    "kvaudit.otlp_schema": "kvaudit.otlp.schema",
    "kvaudit.collector": ("kvaudit.receive.otlp_http", "kvaudit.receive.trace_sink"),
    "kvaudit.sink_exporter": "kvaudit.receive.sink_exporter",
    "kvaudit.reader": ("kvaudit.read.reader", "kvaudit.read.columns", "kvaudit.read.decode", "kvaudit.read.files"),
    "kvaudit.page_scan": "kvaudit.read.page_scan",
    "kvaudit.buffer_pool": "kvaudit.read.buffer_pool",
    "kvaudit.store": ("kvaudit.read.store", "kvaudit.read.open"),
    "kvaudit.arrow_tables": "kvaudit.read.arrow_tables",
    "kvaudit.parquet": "kvaudit.read.parquet",
    "kvaudit.audit": "kvaudit.analyse.audit",
    "kvaudit.analysis": "kvaudit.analyse.named_queries",
    "kvaudit.named_queries": "kvaudit.analyse.named_queries",
    "kvaudit.capacity": "kvaudit.analyse.capacity",
    "kvaudit.report": "kvaudit.present.report",
    "kvaudit.report_html": "kvaudit.present.report_html",
    "kvaudit.findings_output": "kvaudit.present.findings",
    "kvaudit.output": "kvaudit.present.rows",
    "kvaudit.alerts.metrics": "kvaudit.present.metrics",
    "kvaudit.alerts.durations": "kvaudit.durations",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        moved = MOVED[spec.name]
        names = (moved,) if isinstance(moved, str) else moved
        where = " and ".join(names)
        warnings.warn(
            f"{spec.name} moved to {where}; the old path goes in kvaudit 0.3", DeprecationWarning, stacklevel=2
        )
        targets = [importlib.import_module(name) for name in names]

        def attribute(name: str) -> object:
            for target in targets:
                if hasattr(target, name):
                    return getattr(target, name)
            raise AttributeError(f"module {spec.name!r} (moved to {where}) has no attribute {name!r}")

        alias = types.ModuleType(spec.name, f"Moved to {where}.")
        alias.__getattr__ = attribute  # type: ignore[method-assign]
        alias.__dir__ = lambda: sorted({name for target in targets for name in dir(target)})  # type: ignore[method-assign]
        return alias

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module reads from its new home."""


def install() -> None:
    """Make the old paths importable (idempotent)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
