"""Code that runs inside serving processes (installed as `kvaudit.hooks`).

It imports only kvaudit's contract and `kvaudit.emit`, OpenTelemetry, msgspec and the
engine it sits in: never DuckDB, Arrow, numpy, numba, Rich or Textual
(tests/package/test_import_boundaries.py holds it to that).
"""
