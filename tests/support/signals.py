"""Signals for tests of child processes.

A process started from a background shell (`cmd &`, as CI runners and `nohup` start
test runs) inherits SIGINT ignored, and so would its children: a test that sends SIGINT
must restore its default handling in the child first (`preexec_fn=interruptible`), so
that Python installs its KeyboardInterrupt handler there.
"""

from __future__ import annotations

import signal


def interruptible() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: the child takes SIGINT as a terminal's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
