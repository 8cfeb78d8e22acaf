#!/usr/bin/env bash
# promtool (Debian's `prometheus` package), for the tests that check and unit-test the
# Prometheus rules of examples/prometheus/ (tests/present/test_prometheus_rules.py).
# Without it those tests are skipped, so a machine where it cannot be installed still tests.
set -u
command -v promtool >/dev/null && exit 0
if command -v apt-get >/dev/null; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo_="sudo"
    $sudo_ apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
        || { $sudo_ apt-get update -q >/dev/null 2>&1 \
            && $sudo_ apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; }
fi
command -v promtool >/dev/null || echo "install-promtool.sh: promtool not installed; the Prometheus rule tests will be skipped" >&2
exit 0
