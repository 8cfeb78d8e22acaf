"""Reading: trace files decoded into columns (the page scanner, msgspec), held as DuckDB views.

May import: the contract, `kvaudit.otlp`, DuckDB, Arrow, numpy and numba.
"""
