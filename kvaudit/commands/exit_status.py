"""What `kvaudit`'s exit status means (docs/operations.md, "Exit codes"): one outcome per number.

A CI gate or a cron job tells the outcomes apart by the number alone: findings or
firing alerts are not a crash, and a crash is not bad input.
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0
    FOUND = 1  # findings at warning or above, alerts firing (as asked by --fail-on), rule file problems
    BAD_INPUT = 2  # a usage error, an input that cannot be used (named on stderr in one line)
    INTERNAL_ERROR = 3  # a bug in kvaudit: one line on stderr, the traceback with KVAUDIT_DEBUG=1 or --debug
    INCOMPLETE = 4  # an alert rule failed or timed out, or notifications were not delivered
    INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it: 128 + 2
    BROKEN_PIPE = 141  # the reader of stdout went away (`| head`), as shells report SIGPIPE: 128 + 13
    TERMINATED = 143  # stopped by SIGTERM (a supervisor), as shells report it: 128 + 15 (`collect`)
