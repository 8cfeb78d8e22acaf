#!/usr/bin/env bash
# DuckDB 1.4 (its long-term release) in an environment of its own beside .venv, for the
# test that it opens what `kvaudit ingest` writes (tests/package/test_install.py). Without it that
# test is skipped, so a machine that cannot install it still tests.
# Usage: scripts/install-duckdb-1.4.sh PYTHON
set -u
side="$(dirname "$1")/../side/duckdb-1.4"
[ -x "$side/bin/python" ] && exit 0
python3 -m venv "$side" && "$side/bin/python" -m pip install -q --disable-pip-version-check "duckdb>=1.4,<1.5" \
    || { rm -rf "$side"; echo "install-duckdb-1.4.sh: not installed; its test will be skipped" >&2; }
exit 0
