#!/usr/bin/env bash
# tmux, for the test that runs `kvaudit tui` in a real terminal (tests/tui/test_tmux.py).
# Without it that test is skipped, so a machine where it cannot be installed still tests.
set -u
command -v tmux >/dev/null && exit 0
if command -v apt-get >/dev/null; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo_="sudo"
    $sudo_ apt-get install -y -q tmux >/dev/null 2>&1 \
        || { $sudo_ apt-get update -q >/dev/null 2>&1 && $sudo_ apt-get install -y -q tmux >/dev/null 2>&1; }
fi
command -v tmux >/dev/null || echo "install-tmux.sh: tmux not installed; the real-terminal TUI test will be skipped" >&2
exit 0
