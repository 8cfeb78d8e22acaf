#!/usr/bin/env bash
# Chromium, for the test that loads the HTML report in a headless browser (tests/present/test_report_browser.py).
# Without it that test is skipped, so a machine where it cannot be installed still tests.
set -u
command -v chromium >/dev/null && exit 0
if command -v apt-get >/dev/null; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo_="sudo"
    $sudo_ apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
        || { $sudo_ apt-get update -q >/dev/null 2>&1 && $sudo_ apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }
fi
command -v chromium >/dev/null || echo "install-chromium.sh: chromium not installed; the headless report test will be skipped" >&2
exit 0
