#!/usr/bin/env bash
# promtool (Debian's `prometheus` package), for the tests that check and unit-test the
# Prometheus rules of examples/prometheus/ (tests/present/test_prometheus_rules.py).
# Without it those tests are skipped, so a machine where it cannot be installed still tests.
exec bash "$(dirname "$0")/apt-tool.sh" promtool prometheus "the Prometheus rule tests"
