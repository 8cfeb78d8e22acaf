"""OTLP JSON, the wire format every stage shares: its schema as msgspec structs and the encoders.

May import: the OpenTelemetry SDK and proto packages, msgspec. Nothing of kvaudit.
"""
