"""Emitting (serving side): operations become spans with page descriptors, exported as OTLP.

Runs inside serving processes, so it may import only the contract, `kvaudit.otlp`,
OpenTelemetry and msgspec (tests/package/test_import_boundaries.py holds it to that).
"""

from kvaudit.emit.emitter import Emitter, Operation
from kvaudit.emit.setup import replica_resource, setup_emitter

__all__ = ["Emitter", "Operation", "replica_resource", "setup_emitter"]
