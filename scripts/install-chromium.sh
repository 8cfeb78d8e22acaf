#!/usr/bin/env bash
# Chromium, for the test that loads the HTML report in a headless browser (tests/present/test_report_browser.py).
# Without it that test is skipped, so a machine where it cannot be installed still tests.
exec bash "$(dirname "$0")/apt-tool.sh" chromium chromium "the headless report test"
