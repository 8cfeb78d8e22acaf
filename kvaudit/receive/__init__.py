"""Receiving: `kvaudit collect`'s OTLP/HTTP receiver and the sink writing one trace file per replica.

May import: the contract, `kvaudit.otlp`, `kvaudit.emit` (its line files and exporters).
"""
