"""Code that runs inside serving processes (installed as `kvaudit.hooks`).

It imports only kvaudit's contract and emission modules, OpenTelemetry and the
engine it sits in: never DuckDB, Rich or Textual.
"""
