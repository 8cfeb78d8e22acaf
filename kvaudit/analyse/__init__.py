"""Analysing: the auditor's rules, the named queries and the capacity curve, over any backend.

May import: the contract, `kvaudit.backends` (and through it the read stage), DuckDB's
SQL in `queries/`, numpy and numba.
"""
