#!/usr/bin/env bash
# tmux, for the test that runs `kvaudit tui` in a real terminal (tests/tui/test_tmux.py).
# Without it that test is skipped, so a machine where it cannot be installed still tests.
exec bash "$(dirname "$0")/apt-tool.sh" tmux tmux "the real-terminal TUI test"
